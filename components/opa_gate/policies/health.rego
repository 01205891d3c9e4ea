# GET /health/ready: ready once the admission policy and a valid gate config are loaded.
# Both are read from files at start-up, so a (re)started OPA is ready as soon as it has
# read them; the webhook is registered only after the Deployment is ready, so the
# kube-apiserver never meets an OPA without its policy.
# Ref: https://www.openpolicyagent.org/docs/rest-api#custom-health-checks
package system.health

default live := true

default ready := false

# Undefined, so not ready, while admission.rego or gpu_scheduler.rego is missing.
ready if {
	is_object(data.system.main)
	count(data.gpu_cluster.gpu_scheduler.config_errors) == 0
}
