# Who may call this OPA (--authorization=basic); loaded at start-up with the other policies.
#
# The kube-apiserver calls the webhook anonymously over TLS and may only ask for the
# default decision; kubelet probes may read /health. Everything else (the policy and data
# APIs) is refused: policies and data come from files read at start-up, never over HTTP.
# Ref: https://www.openpolicyagent.org/docs/security#authentication-and-authorization
package system.authz

default allow := false

# POST / evaluates the default decision, data.system.main.
allow if {
	input.method == "POST"
	input.path == [""]
}

# /health, /health/live and /health/ready.
allow if {
	input.method == "GET"
	input.path[0] == "health"
}
