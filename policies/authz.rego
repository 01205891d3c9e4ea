# Who may call this OPA. Loaded at start-up (--authorization=basic), before kube-mgmt.
#
# The kube-apiserver calls the webhook anonymously over TLS and may only ask for the
# default decision; kubelet probes may read /health. Everything else, i.e. the management
# API kube-mgmt uses to load policies, needs the bearer token from the pod's own Secret,
# and kube-mgmt reaches it on a loopback-only listener.
# Ref: https://www.openpolicyagent.org/docs/security#authentication-and-authorization
package system.authz

default allow := false

# POST / evaluates the default decision, data.system.main.
allow if {
	input.method == "POST"
	input.path == [""]
}

allow if {
	input.method == "GET"
	input.path[0] == "health"
}

allow if {
	token_configured
	input.identity == data.gpu_cluster.mgmt.token
}

# A missing or short token never matches, so a broken Secret locks management out
# rather than opening it.
token_configured if {
	is_string(data.gpu_cluster.mgmt.token)
	count(data.gpu_cluster.mgmt.token) >= 32
}
