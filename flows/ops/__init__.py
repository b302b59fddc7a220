"""Everything that starts or stops a process: the stack of services (``stack``; ``services`` reads what
runs from their records), the cluster, the engine, the Prefect server's home, the servers prmloop runs
(the embedded broker and its gate, PostgreSQL, the object gateway, the completions server) and the UI
checks. Nothing below ``flows/`` starts a process."""
