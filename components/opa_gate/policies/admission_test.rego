package system

# Builders

gate_config := {
	"scheduler_name": "gpu-binpack-scheduler",
	"gpu_resources": "nvidia.com/gpu,example.com/dongle",
	"gpu_resource_prefixes": "nvidia.com/mig-",
}

review_uid := "705ab4f5-6393-11e8-b7cc-42010a800002"

# A pod CREATE request for team-a/train-0 with one container; overrides merge into the request.
pod_request(limits, scheduler, overrides) := object.union(
	{
		"uid": review_uid,
		"kind": {"group": "", "version": "v1", "kind": "Pod"},
		"resource": {"group": "", "version": "v1", "resource": "pods"},
		"namespace": "team-a",
		"name": "train-0",
		"operation": "CREATE",
		"object": {
			"apiVersion": "v1",
			"kind": "Pod",
			"metadata": {"name": "train-0", "namespace": "team-a"},
			"spec": {
				"schedulerName": scheduler,
				"containers": [{"name": "main", "image": "registry.example/train:1", "resources": {"limits": limits}}],
			},
		},
	},
	overrides,
)

make_review(request) := {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}

gpu_denial := `pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is "default-scheduler"; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`

dongle_denial := `pod "team-a/train-0" requests example.com/dongle but spec.schedulerName is "default-scheduler"; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`

malformed := "malformed AdmissionReview: input.request is missing or not an object"

# Responses

test_main_denies_gpu_pod_off_binpack_scheduler if {
	main == {
		"apiVersion": "admission.k8s.io/v1",
		"kind": "AdmissionReview",
		"response": {
			"uid": review_uid,
			"allowed": false,
			"status": {"code": 403, "message": gpu_denial},
		},
	} with input as make_review(pod_request({"nvidia.com/gpu": "1"}, "default-scheduler", {}))
		with data.gpu_cluster.config as gate_config
}

test_main_allows_gpu_pod_on_binpack_scheduler if {
	main == {
		"apiVersion": "admission.k8s.io/v1",
		"kind": "AdmissionReview",
		"response": {"uid": review_uid, "allowed": true},
	} with input as make_review(pod_request({"nvidia.com/gpu": "1"}, "gpu-binpack-scheduler", {}))
		with data.gpu_cluster.config as gate_config
}

test_main_allows_cpu_only_pod if {
	main.response == {"uid": review_uid, "allowed": true} with input as make_review(pod_request({"cpu": "1"}, "default-scheduler", {}))
		with data.gpu_cluster.config as gate_config
}

test_main_joins_messages_in_sorted_order if {
	main.response.status.message == concat(", ", [dongle_denial, gpu_denial]) with input as make_review(pod_request({"nvidia.com/gpu": "1", "example.com/dongle": "1"}, "default-scheduler", {}))
		with data.gpu_cluster.config as gate_config
}

test_main_allows_other_operations if {
	main.response == {"uid": review_uid, "allowed": true} with input as make_review(pod_request({"nvidia.com/gpu": "1"}, "default-scheduler", {"operation": "UPDATE"}))
		with data.gpu_cluster.config as gate_config
}

test_main_denies_gpu_pod_when_config_missing if {
	main.response == {
		"uid": review_uid,
		"allowed": false,
		"status": {"code": 403, "message": `pod "team-a/train-0" requests nvidia.com/gpu but the GPU scheduler gate is not configured (the parameter document is missing or not an object); GPU pods are refused until it is`},
	} with input as make_review(pod_request({"nvidia.com/gpu": "1"}, "gpu-binpack-scheduler", {}))
}

# Malformed reviews: always a well-formed response, uid echoed when present

test_main_denies_review_without_request if {
	main == {
		"apiVersion": "admission.k8s.io/v1",
		"kind": "AdmissionReview",
		"response": {"uid": "", "allowed": false, "status": {"code": 403, "message": malformed}},
	} with input as {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
}

test_main_denies_null_input if {
	main.response == {"uid": "", "allowed": false, "status": {"code": 403, "message": malformed}} with input as null
}

test_main_denies_request_that_is_not_an_object if {
	main.response == {"uid": "", "allowed": false, "status": {"code": 403, "message": malformed}} with input as {"request": "CREATE"}
}

test_main_echoes_uid_when_pod_cannot_be_evaluated if {
	main.response == {
		"uid": review_uid,
		"allowed": false,
		"status": {"code": 403, "message": `pod "team-a/train-0" cannot be evaluated: request.object.spec is missing or not an object`},
	} with input as make_review(object.remove(pod_request({}, "default-scheduler", {}), ["object"]))
		with data.gpu_cluster.config as gate_config
}

test_main_answers_empty_uid_when_request_has_none if {
	main.response == {"uid": "", "allowed": true} with input as make_review(object.remove(pod_request({"cpu": "1"}, "default-scheduler", {}), ["uid"]))
		with data.gpu_cluster.config as gate_config
}
