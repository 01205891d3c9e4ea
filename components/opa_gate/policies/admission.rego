# The webhook's decision: OPA's default decision is data.system.main, served raw at
# POST / (no {"result": ...} wrapper), which is what the kube-apiserver expects back.
#
# main is defined for every input so the endpoint never answers 404; a review with
# no request is denied with a message rather than allowed by accident.
# Ref: https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#response
package system

import data.gpu_cluster.gpu_scheduler

main := {
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"response": response,
}

# The API server rejects a response whose uid does not match its request.
default uid := ""

uid := input.request.uid

deny contains msg if {
	some msg in gpu_scheduler.deny
}

# A helper rule, because `not is_object(input.request)` is undefined, not true,
# when input.request is undefined.
has_request if is_object(input.request)

deny contains "malformed AdmissionReview: input.request is missing or not an object" if not has_request

response := {
	"uid": uid,
	"allowed": false,
	"status": {"code": 403, "message": concat(", ", deny)},
} if {
	count(deny) > 0
} else := {"uid": uid, "allowed": true}
