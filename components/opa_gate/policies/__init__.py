"""The gate's policies: Rego for OPA (*.rego) and, beside it, the CEL of the native engines."""
