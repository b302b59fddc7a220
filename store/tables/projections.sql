-- Projections over the event log. Every table a person queries is derived from `events`;
-- a label is never updated, a newer event supersedes it. Created by the sink (the only writer).

CREATE OR REPLACE VIEW questions AS
SELECT
    payload->>'question_id' AS question_id,
    payload->>'dataset' AS dataset,
    payload->>'problem' AS problem,
    payload->>'gold_answer' AS gold_answer,
    payload->>'source' AS source,
    payload->'metadata' AS metadata,
    occurred_at AS registered_at,
    event_id
FROM events
WHERE event_type = 'QuestionRegistered'
QUALIFY row_number() OVER (PARTITION BY payload->>'question_id' ORDER BY occurred_at DESC, event_id) = 1;

CREATE OR REPLACE VIEW question_priorities AS
SELECT
    payload->>'question_id' AS question_id,
    CAST(payload->>'priority' AS DOUBLE) AS priority,
    CAST(payload->>'round' AS INTEGER) AS round,
    payload->'signals' AS signals,
    occurred_at AS prioritized_at,
    event_id
FROM events
WHERE event_type = 'QuestionPrioritized'
QUALIFY row_number() OVER (PARTITION BY payload->>'question_id' ORDER BY occurred_at DESC, event_id) = 1;

CREATE OR REPLACE VIEW solutions AS
SELECT
    payload->>'solution_id' AS solution_id,
    payload->>'question_id' AS question_id,
    payload->'generator'->>'backend' AS generator_backend,
    payload->'generator'->>'name' AS generator,
    payload->>'prompt_format' AS prompt_format,
    CAST(json_array_length(payload->'steps') AS INTEGER) AS n_steps,
    payload->>'final_answer' AS final_answer,
    payload->>'gold_answer' AS gold_answer,
    TRY_CAST(payload->>'correct' AS BOOLEAN) AS correct,
    TRY_CAST(payload->'uncertainty'->>'entropy' AS DOUBLE) AS entropy,
    TRY_CAST(payload->'uncertainty'->>'mean_nll' AS DOUBLE) AS mean_nll,
    payload->>'selected_by' AS selected_by,
    CAST(payload->>'completion_tokens' AS BIGINT) AS completion_tokens,
    CAST(payload->'sampling'->>'temperature' AS DOUBLE) AS temperature,
    TRY_CAST(payload->'sampling'->>'seed' AS BIGINT) AS seed,
    payload->>'text' AS text,
    occurred_at AS sampled_at,
    event_id
FROM events
WHERE event_type = 'SolutionSampled'
QUALIFY row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1;

CREATE OR REPLACE VIEW steps AS
SELECT
    solution_id,
    question_id,
    CAST(generate_subscripts(step_texts, 1) - 1 AS INTEGER) AS step_index,
    unnest(step_texts) AS text
FROM (
    SELECT
        payload->>'solution_id' AS solution_id,
        payload->>'question_id' AS question_id,
        from_json(payload->'steps', '["VARCHAR"]') AS step_texts
    FROM events
    WHERE event_type = 'SolutionSampled'
    QUALIFY row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1
);

CREATE OR REPLACE VIEW step_scores AS
SELECT
    solution_id,
    CAST(generate_subscripts(u, 1) - 1 AS INTEGER) AS step_index,
    unnest(u) AS uncertainty,
    unnest(du) AS uncertainty_delta,
    scorer,
    occurred_at,
    event_id
FROM (
    SELECT
        payload->>'solution_id' AS solution_id,
        from_json(payload->'step_uncertainty', '["DOUBLE"]') AS u,
        from_json(payload->'uncertainty_delta', '["DOUBLE"]') AS du,
        payload->'scorer'->>'name' AS scorer,
        occurred_at,
        event_id
    FROM events
    WHERE event_type = 'StepsScored'
);

-- Every label any source ever gave any step, newest last. source: StepsLabeled (MC annotation),
-- StepsJudged (LLM judge verdicts), LabelsAccepted (consensus).
CREATE OR REPLACE VIEW label_history AS
SELECT
    solution_id,
    question_id,
    CAST(generate_subscripts(step_labels, 1) - 1 AS INTEGER) AS step_index,
    unnest(step_labels) AS label,
    source,
    method,
    first_error_step,
    occurred_at,
    event_id
FROM (
    SELECT
        payload->>'solution_id' AS solution_id,
        payload->>'question_id' AS question_id,
        from_json(coalesce(payload->'labels', payload->'verdicts'), '["BOOLEAN"]') AS step_labels,
        event_type AS source,
        coalesce(payload->>'method', payload->>'rule', payload->'judge'->>'name') AS method,
        TRY_CAST(payload->>'first_error_step' AS INTEGER) AS first_error_step,
        occurred_at,
        event_id
    FROM events
    WHERE event_type IN ('StepsLabeled', 'StepsJudged', 'LabelsAccepted')
);

-- The label in force for each step: consensus beats annotation beats a judge; then the newest wins.
CREATE OR REPLACE VIEW current_labels AS
SELECT
    solution_id,
    question_id,
    step_index,
    label,
    source,
    method,
    first_error_step,
    occurred_at AS labeled_at,
    event_id,
    count(*) OVER (PARTITION BY solution_id, step_index) AS n_versions
FROM label_history
QUALIFY row_number() OVER (
    PARTITION BY solution_id, step_index
    ORDER BY CASE source WHEN 'LabelsAccepted' THEN 0 WHEN 'StepsLabeled' THEN 1 ELSE 2 END,
             occurred_at DESC, event_id DESC
) = 1;

CREATE OR REPLACE VIEW consensus AS
SELECT
    payload->>'solution_id' AS solution_id,
    payload->>'question_id' AS question_id,
    CASE event_type WHEN 'LabelsAccepted' THEN 'accepted' ELSE 'rejected' END AS decision,
    payload->>'rule' AS rule,
    payload->>'reason' AS reason,
    TRY_CAST(payload->>'first_error_step' AS INTEGER) AS first_error_step,
    occurred_at,
    event_id
FROM events
WHERE event_type IN ('LabelsAccepted', 'LabelsRejected');

CREATE OR REPLACE VIEW cost_ledger AS
SELECT
    payload->>'solution_id' AS solution_id,
    payload->>'question_id' AS question_id,
    event_type AS source,
    coalesce(payload->>'method', payload->'judge'->>'name') AS method,
    CAST(payload->'cost'->>'verified_steps' AS BIGINT) AS verified_steps,
    CAST(payload->'cost'->>'rollouts' AS BIGINT) AS rollouts,
    CAST(payload->'cost'->>'generated_tokens' AS BIGINT) AS generated_tokens,
    CAST(payload->'cost'->>'wall_time_s' AS DOUBLE) AS wall_time_s,
    payload->'cost'->'failures' AS failures,
    occurred_at,
    event_id
FROM events
WHERE event_type IN ('StepsLabeled', 'StepsJudged');

-- `promoted`: the registry's decision when the model was registered (its metric was not worse than
-- the model then in force); `signed`: it carries a signature that is not empty (an empty one, `""`, is
-- unsigned, as the registry reads it); `in_force`: the newest promoted signed
-- model of its kind. SQL cannot check the signature (the key is in no table): store/tables/registry.py
-- (models_in_force) does, and so what the loop uses, `models list` and `status` name the newest
-- promoted model whose signature verifies. Several models of a kind may have been promoted.
CREATE OR REPLACE VIEW model_versions AS
SELECT
    *,
    promoted AND signed AND row_number() OVER (
        PARTITION BY kind, promoted AND signed ORDER BY registered_at DESC, event_id DESC
    ) = 1 AS in_force
FROM (
    SELECT
        payload->>'model_id' AS model_id,
        payload->>'kind' AS kind,
        coalesce(TRY_CAST(payload->'parameters'->>'promoted' AS BOOLEAN), false) AS promoted,
        coalesce(payload->>'signature', '') <> '' AS signed,
        payload->'parameters'->>'decision' AS decision,
        payload->'base_model'->>'name' AS base_model,
        payload->>'artifact_uri' AS artifact_uri,
        payload->>'dataset_snapshot' AS dataset_snapshot,
        CAST(payload->>'train_examples' AS BIGINT) AS train_examples,
        payload->'metrics' AS metrics,
        occurred_at AS registered_at,
        event_id
    FROM events
    WHERE event_type = 'ModelRegistered'
);

CREATE OR REPLACE VIEW calibrations AS
SELECT
    payload->>'calibration_id' AS calibration_id,
    payload->>'generator' AS generator,
    payload->>'prm' AS prm,
    payload->>'score_rule' AS score_rule,
    payload->>'method' AS method,
    payload->'fit' AS fit,
    payload->'metrics' AS metrics,
    occurred_at AS fitted_at,
    event_id
FROM events
WHERE event_type = 'CalibrationFitted';

-- The LLM judge's verdict and uncertainty per judged step (CoT Entropy paper: Eq. 5, 7, 9).
CREATE OR REPLACE VIEW step_judgments AS
SELECT
    payload->>'solution_id' AS solution_id,
    payload->>'question_id' AS question_id,
    payload->'judge'->>'name' AS judge,
    payload->>'method' AS method,
    CAST(j->>'step_index' AS INTEGER) AS step_index,
    CAST(j->>'has_error' AS BOOLEAN) AS has_error,
    CAST(j->>'p_error' AS DOUBLE) AS p_error,
    CAST(j->>'cot_entropy' AS DOUBLE) AS cot_entropy,
    CAST(j->>'cot_entropy_discrete' AS DOUBLE) AS cot_entropy_discrete,
    CAST(j->>'naive_entropy' AS DOUBLE) AS naive_entropy,
    CAST(j->>'epistemic' AS DOUBLE) AS epistemic,
    CAST(j->>'aleatoric' AS DOUBLE) AS aleatoric,
    CAST(j->>'unparsed' AS INTEGER) AS unparsed_samples,
    occurred_at,
    event_id
FROM (
    SELECT payload, occurred_at, event_id, unnest(from_json(payload->'judgments', '["JSON"]')) AS j
    FROM events
    WHERE event_type = 'StepsJudged'
);

-- The selector's decisions (ActPRM's rule on the promoted ensemble PRM): what was skipped, and why.
-- `is_latest`: the newest decision on the solution (a newer PRM may take up what an older one skipped).
CREATE OR REPLACE VIEW selections AS
SELECT
    payload->>'solution_id' AS solution_id,
    payload->>'question_id' AS question_id,
    payload->>'decision' AS decision,
    payload->>'reason' AS reason,
    payload->'prm'->>'name' AS prm,
    payload->>'rule' AS rule,
    TRY_CAST(payload->>'score' AS DOUBLE) AS score,
    TRY_CAST(payload->>'checked_steps' AS BIGINT) AS checked_steps,
    from_json(payload->'step_mean', '["DOUBLE"]') AS step_mean,
    from_json(payload->'step_std', '["DOUBLE"]') AS step_std,
    payload->'thresholds' AS thresholds,
    TRY_CAST(payload->'scored'->>'correct' AS BOOLEAN) AS correct,
    row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1 AS is_latest,
    occurred_at,
    event_id
FROM events
WHERE event_type = 'SolutionSelected';

-- MC annotation against each judge, per solution: the newest MC first error (StepsLabeled), the newest
-- verdict of each judge method, whether the judge decided (a verdict on every step before its first
-- error, on every step when it found none: what consensus needs), whether the two first errors agree
-- (NULL where the judge did not decide; no error on both sides agrees), and consensus's decision.
CREATE OR REPLACE VIEW label_agreement AS
WITH mc AS (
    SELECT
        payload->>'solution_id' AS solution_id,
        payload->>'question_id' AS question_id,
        TRY_CAST(payload->>'first_error_step' AS INTEGER) AS first_error_step
    FROM events
    WHERE event_type = 'StepsLabeled'
    QUALIFY row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id DESC) = 1
),
judged AS (
    SELECT
        payload->>'solution_id' AS solution_id,
        payload->>'method' AS method,
        TRY_CAST(payload->>'first_error_step' AS INTEGER) AS first_error_step,
        from_json(payload->'verdicts', '["BOOLEAN"]') AS verdicts,
        payload->>'reason' AS reason
    FROM events
    WHERE event_type = 'StepsJudged'
    QUALIFY row_number() OVER (
        PARTITION BY payload->>'solution_id', payload->>'method' ORDER BY occurred_at DESC, event_id DESC
    ) = 1
),
decided AS (
    SELECT
        *,
        len(verdicts) > 0
            AND coalesce(first_error_step, 0) < len(verdicts)
            AND len(list_filter(
                list_slice(verdicts, 1, coalesce(first_error_step, len(verdicts))), v -> v IS NULL
            )) = 0 AS judge_decided
    FROM judged
),
decisions AS (
    SELECT solution_id, decision, reason
    FROM consensus
    QUALIFY row_number() OVER (PARTITION BY solution_id ORDER BY occurred_at DESC, event_id DESC) = 1
)
SELECT
    mc.solution_id,
    mc.question_id,
    mc.first_error_step AS mc_first_error,
    d.method AS judge_method,
    d.first_error_step AS judge_first_error,
    d.judge_decided,
    CASE WHEN d.judge_decided THEN mc.first_error_step IS NOT DISTINCT FROM d.first_error_step END AS agree,
    d.reason AS judge_reason,
    c.decision,
    c.reason AS decision_reason
FROM mc
JOIN decided d USING (solution_id)
LEFT JOIN decisions c USING (solution_id);
