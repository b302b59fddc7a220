"""What ``prmloop sql`` lets through: statements that only read, calling no function that reaches
PostgreSQL or runs SQL text. Checked with DuckDB's own parser and tokenizer before any connection
opens, on the DuckDB file and on a DuckLake alike (store/tables/duck.py runs the check in ``query``)."""

from __future__ import annotations

import re

import duckdb

__all__ = [
    "READING_DUCKLAKE_FUNCTIONS",
    "READ_ONLY_STATEMENTS",
    "REFUSED_FUNCTIONS",
    "REFUSED_FUNCTION_PREFIXES",
    "ReadOnlyViolation",
    "check_read_only",
]


class ReadOnlyViolation(ValueError):
    pass


#: What ``prmloop sql`` accepts; anything else (INSERT, COPY, ATTACH, SET, PRAGMA, CALL, ...) is refused.
READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})

#: Functions no query may call, in any statement: those of the PostgreSQL scanner (a DuckLake
#: reader has it loaded for the catalog; ``postgres_query`` would run any SQL there and
#: ``postgres_scan`` connect to any host), and those that run SQL text (which no statement check
#: could see). Matched by name, quoted or not, in any case.
REFUSED_FUNCTION_PREFIXES = ("postgres_",)
REFUSED_FUNCTIONS = frozenset(
    {"pg_clear_cache", "read_postgres_binary", "query", "query_table", "json_execute_serialized_sql"}
)
#: The DuckLake extension's functions a reader may call: those that only read the lake's metadata or
#: its change feed. Every other ``ducklake_*`` function is refused, whatever a new version of the
#: extension adds: they write (``ducklake_merge_adjacent_files`` left a new Parquet file per call,
#: ``ducklake_add_data_files``, ``ducklake_rewrite_data_files``, ``ducklake_expire_snapshots``, the
#: clean-ups, ``ducklake_commit``), set options (``ducklake_set_option`` crashed the process with
#: SIGSEGV on a read-only attach) or scan files directly (``ducklake_scan``).
READING_DUCKLAKE_FUNCTIONS = frozenset(
    {
        "ducklake_current_snapshot",
        "ducklake_last_committed_snapshot",
        "ducklake_list_files",
        "ducklake_options",
        "ducklake_settings",
        "ducklake_snapshots",
        "ducklake_table_changes",
        "ducklake_table_deletions",
        "ducklake_table_info",
        "ducklake_table_insertions",
    }
)


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(str(text).split())[:limit]


def _explained_statement(query: str) -> str | None:
    """The statement an ``EXPLAIN [ANALYZE] [(options)]`` statement explains, or None if not found.

    Found with DuckDB's own tokenizer, so comments and spacing cannot hide what follows.
    """
    tokens = duckdb.tokenize(query)
    words = [
        (pos, query[pos : tokens[i + 1][0] if i + 1 < len(tokens) else len(query)].strip())
        for i, (pos, kind) in enumerate(tokens)
        if kind != duckdb.token_type.comment
    ]
    i = 0
    if i < len(words) and words[i][1].upper() == "EXPLAIN":
        i += 1
    else:
        return None
    if i < len(words) and words[i][1].upper() == "ANALYZE":
        i += 1
    if i < len(words) and words[i][1].startswith("("):  # EXPLAIN (FORMAT json) ...: skip the options
        depth = 0
        while i < len(words):
            depth += words[i][1].count("(") - words[i][1].count(")")
            i += 1
            if depth <= 0:
                break
    return query[words[i][0] :] if i < len(words) else None


def check_read_only(sql: str) -> list[str]:
    """The statements of ``sql`` if every one only reads; otherwise :class:`ReadOnlyViolation`.

    ``EXPLAIN`` is allowed only of a reading statement: ``EXPLAIN ANALYZE`` executes what it explains
    (``EXPLAIN ANALYZE CREATE TEMP TABLE ...`` would create a table even on a read-only connection).
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyViolation(f"the query does not parse: {_one_line(str(exc))}") from exc
    if not statements:
        raise ReadOnlyViolation("the query is empty: give a SELECT statement")
    for i, st in enumerate(statements, 1):
        # Compared with ==, never `is`: DuckDB 1.5's enum values are new objects on every access.
        kind = st.type
        explained = False
        if kind == duckdb.StatementType.EXPLAIN:
            explained = True
            inner = _explained_statement(st.query)
            try:
                inner_statements = duckdb.extract_statements(inner) if inner else []
            except duckdb.Error:
                inner_statements = []
            if len(inner_statements) != 1:
                raise ReadOnlyViolation(
                    f"statement {i} is an EXPLAIN whose statement cannot be read: give EXPLAIN SELECT ..."
                )
            kind = inner_statements[0].type
            if kind == duckdb.StatementType.EXPLAIN:
                raise ReadOnlyViolation(f"statement {i} explains an EXPLAIN: give EXPLAIN SELECT ...")
        if kind not in READ_ONLY_STATEMENTS:
            shown = _statement_name(inner if explained and inner else st.query, kind)
            raise ReadOnlyViolation(
                f"statement {i} is {'an EXPLAIN of ' if explained else ''}{shown}: `prmloop sql` "
                "only reads (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of those). The store is "
                "changed only by events, through the sink; export results with --format csv/json instead of COPY."
            )
    for i, st in enumerate(statements, 1):
        called = _refused_call(st.query)
        if called:
            raise ReadOnlyViolation(
                f"statement {i} calls {called}(): `prmloop sql` reads the store's tables and views only; "
                "functions that reach PostgreSQL, run SQL text, or change the lake or its options are refused"
            )
    return [st.query for st in statements]


#: Statements DuckDB parses into another statement's kind (INSTALL is a LOAD statement, USE a SET, UPDATE
#: EXTENSIONS has none), named in a refusal by their own first words.
_TWO_WORD_STARTS = frozenset({"FORCE", "UPDATE"})


def _statement_name(sql: str, kind: duckdb.StatementType) -> str:
    """What the statement is, as its text says: ``INSTALL`` for ``INSTALL httpfs`` (which DuckDB
    calls a LOAD statement), else DuckDB's kind."""
    words = [
        sql[pos : pos + 64].split(None, 1)[0].upper() if sql[pos : pos + 64].split() else ""
        for pos, token in duckdb.tokenize(sql)[:2]
        if token == duckdb.token_type.keyword
    ]
    if not words or words[0] == kind.name:
        return str(kind.name)
    return " ".join(words[:2]) if words[0] in _TWO_WORD_STARTS and len(words) > 1 else words[0]


_NAME = re.compile(r'"((?:[^"]|"")*)"|([\w$]+)')


def _refused_call(sql: str) -> str | None:
    """The first refused function ``sql`` calls (a name followed by ``(``), or None.

    Read with DuckDB's tokenizer: comments, quoting, case and schema qualification hide nothing."""
    tokens = duckdb.tokenize(sql)
    texts = [sql[pos : tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)] for i, (pos, _) in enumerate(tokens)]
    for i, ((_, kind), text) in enumerate(zip(tokens, texts, strict=True)):
        if kind not in (duckdb.token_type.identifier, duckdb.token_type.keyword) or i + 1 == len(tokens):
            continue
        match = _NAME.match(text)
        if match is None or not texts[i + 1].lstrip().startswith("("):
            continue
        name = (match.group(2) or match.group(1).replace('""', '"')).lower()
        if name in REFUSED_FUNCTIONS or name.startswith(REFUSED_FUNCTION_PREFIXES):
            return name
        if name.startswith("ducklake_") and name not in READING_DUCKLAKE_FUNCTIONS:
            return name
    return None
