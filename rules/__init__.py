"""Alert and recording rules from rules/config.yaml: `config` (load and validate),
`definitions` (training-job definitions the report shares), `promql` (helpers),
`alerts/` (one module per area), `groups` (rule groups as data) and `generate` (writes
the rule files in a checkout)."""
