# GET /health/ready: ready once kube-mgmt has loaded the GPU scheduler policy and the gate's
# config is present. The webhook is registered only after the Deployment is ready, so the
# kube-apiserver never meets an OPA with no policy.
# Ref: https://www.openpolicyagent.org/docs/rest-api#custom-health-checks
package system.health

default live := true

default ready := false

ready if {
	is_set(data.gpu_cluster.gpu_scheduler.deny)
	is_object(data.gpu_cluster.config)
}
