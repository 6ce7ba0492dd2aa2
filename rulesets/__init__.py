"""The rule sets shipped with rulegraph (YAML files in this folder), loadable by name:
``RuleSet.load("lrp-ah-ln")``. See each file's description, and the README's
rule-file walkthrough for the schema."""
