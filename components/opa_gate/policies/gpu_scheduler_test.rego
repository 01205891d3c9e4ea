package gpu_cluster.gpu_scheduler

# Builders

gate_config := {
	"scheduler_name": "gpu-binpack-scheduler",
	"gpu_resources": "nvidia.com/gpu,example.com/dongle",
	"gpu_resource_prefixes": "nvidia.com/mig-",
}

container(name, resources) := {"name": name, "image": "registry.example/train:1", "resources": resources}

cpu_only := {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}

gpu_limit := {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}

# team-a/train-0 with one CPU-only container; overrides merge recursively, lists are replaced.
make_pod(overrides) := object.union(
	{
		"apiVersion": "v1",
		"kind": "Pod",
		"metadata": {"name": "train-0", "namespace": "team-a"},
		"spec": {"containers": [container("main", cpu_only)]},
	},
	overrides,
)

# A pod CREATE review; request_overrides merge into the request.
make_review(pod_object, request_overrides) := {
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"request": object.union(
		{
			"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
			"kind": {"group": "", "version": "v1", "kind": "Pod"},
			"resource": {"group": "", "version": "v1", "resource": "pods"},
			"namespace": "team-a",
			"operation": "CREATE",
			"object": pod_object,
		},
		request_overrides,
	),
}

review_of(pod_overrides) := make_review(make_pod(pod_overrides), {})

gpu_pod_review(spec_overrides) := review_of({"spec": object.union(
	{"containers": [container("main", gpu_limit)]},
	spec_overrides,
)})

binpack := {"schedulerName": "gpu-binpack-scheduler"}

unset_gpu_denial := `pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`

# Scheduler name

test_deny_gpu_limit_without_scheduler_name if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({})
		with data.gpu_cluster.config as gate_config
}

test_deny_gpu_pod_on_default_scheduler if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is "default-scheduler"; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as gpu_pod_review({"schedulerName": "default-scheduler"})
		with data.gpu_cluster.config as gate_config
}

test_deny_gpu_pod_with_empty_scheduler_name if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is ""; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as gpu_pod_review({"schedulerName": ""})
		with data.gpu_cluster.config as gate_config
}

test_deny_scheduler_name_differing_in_case if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is "GPU-Binpack-Scheduler"; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as gpu_pod_review({"schedulerName": "GPU-Binpack-Scheduler"})
		with data.gpu_cluster.config as gate_config
}

test_allow_gpu_pod_with_binpack_scheduler if {
	count(deny) == 0 with input as gpu_pod_review(binpack)
		with data.gpu_cluster.config as gate_config
}

test_allow_cpu_only_pod if {
	count(deny) == 0 with input as review_of({})
		with data.gpu_cluster.config as gate_config
}

test_allow_cpu_only_pod_on_binpack_scheduler if {
	count(deny) == 0 with input as review_of({"spec": binpack})
		with data.gpu_cluster.config as gate_config
}

test_scheduler_name_comes_from_config if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is "gpu-binpack-scheduler"; GPU pods must set spec.schedulerName: other-binpack`} with input as gpu_pod_review(binpack)
		with data.gpu_cluster.config as object.union(gate_config, {"scheduler_name": "other-binpack"})
}

# Where GPU requests hide

test_deny_gpu_request_without_limit if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [container("main", {"requests": {"nvidia.com/gpu": "1"}})]})
		with data.gpu_cluster.config as gate_config
}

test_deny_gpu_in_second_container if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [
		container("sidecar", cpu_only),
		container("main", gpu_limit),
	]})
		with data.gpu_cluster.config as gate_config
}

test_deny_mig_profile_in_init_container if {
	deny == {`pod "team-a/train-0" requests nvidia.com/mig-1g.5gb but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as gpu_pod_review({
		"containers": [container("main", cpu_only)],
		"initContainers": [container("warmup", {"limits": {"nvidia.com/mig-1g.5gb": "1"}})],
	})
		with data.gpu_cluster.config as gate_config
}

# The API server refuses resources on ephemeral containers; scanning them costs nothing.
test_deny_gpu_in_ephemeral_container if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({
		"containers": [container("main", cpu_only)],
		"ephemeralContainers": [container("debug", gpu_limit)],
	})
		with data.gpu_cluster.config as gate_config
}

test_deny_gpu_in_pod_level_resources if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({
		"containers": [container("main", cpu_only)],
		"resources": gpu_limit,
	})
		with data.gpu_cluster.config as gate_config
}

test_deny_configured_extended_resource if {
	deny == {`pod "team-a/train-0" requests example.com/dongle but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as gpu_pod_review({"containers": [container("main", {"limits": {"example.com/dongle": "2"}})]})
		with data.gpu_cluster.config as gate_config
}

test_deny_configured_prefix if {
	deny == {`pod "team-a/train-0" requests example.com/vgpu-a10 but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as gpu_pod_review({"containers": [container("main", {"limits": {"example.com/vgpu-a10": "1"}})]})
		with data.gpu_cluster.config as object.union(gate_config, {"gpu_resource_prefixes": "example.com/vgpu-"})
}

test_allow_extended_resource_not_configured if {
	count(deny) == 0 with input as gpu_pod_review({"containers": [container("main", {"limits": {"example.com/fpga": "1"}})]})
		with data.gpu_cluster.config as gate_config
}

test_baseline_resources_gated_when_config_lists_omit_them if {
	deny == {
		unset_gpu_denial,
		`pod "team-a/train-0" requests nvidia.com/mig-2g.10gb but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`,
	} with input as gpu_pod_review({"containers": [container("main", {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-2g.10gb": "1"}})]})
		with data.gpu_cluster.config as {"scheduler_name": "gpu-binpack-scheduler", "gpu_resources": "", "gpu_resource_prefixes": ""}
}

test_deny_one_message_per_resource if {
	deny == {
		`pod "team-a/train-0" requests example.com/dongle but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`,
		unset_gpu_denial,
	} with input as gpu_pod_review({"containers": [
		container("a", {"limits": {"nvidia.com/gpu": "1"}}),
		container("b", {"limits": {"nvidia.com/gpu": "2", "example.com/dongle": "1"}}),
	]})
		with data.gpu_cluster.config as gate_config
}

# Quantities

test_deny_numeric_gpu_quantity if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [container("main", {"limits": {"nvidia.com/gpu": 1}})]})
		with data.gpu_cluster.config as gate_config
}

test_allow_zero_gpu_string if {
	count(deny) == 0 with input as gpu_pod_review({"containers": [container("main", {"limits": {"nvidia.com/gpu": "0"}})]})
		with data.gpu_cluster.config as gate_config
}

test_allow_zero_gpu_number if {
	count(deny) == 0 with input as gpu_pod_review({"containers": [container("main", {"requests": {"nvidia.com/gpu": 0}, "limits": {"nvidia.com/gpu": 0}})]})
		with data.gpu_cluster.config as gate_config
}

test_deny_zero_request_with_nonzero_limit if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [container("main", {"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "1"}})]})
		with data.gpu_cluster.config as gate_config
}

test_deny_unparsable_gpu_quantity if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [container("main", {"limits": {"nvidia.com/gpu": "lots"}})]})
		with data.gpu_cluster.config as gate_config
}

test_deny_null_gpu_quantity if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [container("main", {"limits": {"nvidia.com/gpu": null}})]})
		with data.gpu_cluster.config as gate_config
}

# Malformed pods

test_allow_null_resources if {
	count(deny) == 0 with input as gpu_pod_review({"containers": [container("main", null)]})
		with data.gpu_cluster.config as gate_config
}

test_allow_null_limits if {
	count(deny) == 0 with input as gpu_pod_review({"containers": [container("main", {"limits": null})]})
		with data.gpu_cluster.config as gate_config
}

test_allow_container_without_resources if {
	count(deny) == 0 with input as gpu_pod_review({"containers": [{"name": "main", "image": "busybox"}]})
		with data.gpu_cluster.config as gate_config
}

test_null_limits_do_not_hide_gpu_requests if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"containers": [container("main", {"limits": null, "requests": {"nvidia.com/gpu": "1"}})]})
		with data.gpu_cluster.config as gate_config
}

test_missing_containers_do_not_hide_init_containers if {
	deny == {unset_gpu_denial} with input as make_review(
		{"metadata": {"name": "train-0", "namespace": "team-a"}, "spec": {"initContainers": [container("warmup", gpu_limit)]}},
		{},
	)
		with data.gpu_cluster.config as gate_config
}

test_allow_spec_without_containers if {
	count(deny) == 0 with input as make_review({"metadata": {"name": "train-0"}, "spec": {}}, {})
		with data.gpu_cluster.config as gate_config
}

test_deny_pod_without_spec if {
	deny == {`pod "team-a/train-0" cannot be evaluated: request.object.spec is missing or not an object`} with input as make_review({"metadata": {"name": "train-0", "namespace": "team-a"}}, {})
		with data.gpu_cluster.config as gate_config
}

test_deny_request_without_object if {
	deny == {`pod "team-a/train-0" cannot be evaluated: request.object.spec is missing or not an object`} with input as {"request": {
		"uid": "1",
		"kind": {"kind": "Pod"},
		"operation": "CREATE",
		"namespace": "team-a",
		"name": "train-0",
	}}
		with data.gpu_cluster.config as gate_config
}

# What is evaluated

test_allow_update_of_gpu_pod if {
	count(deny) == 0 with input as make_review(make_pod({"spec": {"containers": [container("main", gpu_limit)]}}), {"operation": "UPDATE"})
		with data.gpu_cluster.config as gate_config
}

test_allow_delete_without_object if {
	count(deny) == 0 with input as {"request": {"uid": "1", "kind": {"kind": "Pod"}, "operation": "DELETE", "namespace": "team-a", "name": "train-0"}}
		with data.gpu_cluster.config as gate_config
}

test_allow_other_kind if {
	count(deny) == 0 with input as make_review(
		{"metadata": {"name": "cm"}, "spec": {"containers": [container("main", gpu_limit)]}},
		{"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}, "resource": {"group": "", "version": "v1", "resource": "configmaps"}},
	)
		with data.gpu_cluster.config as gate_config
}

test_deny_pod_identified_by_resource_only if {
	deny == {unset_gpu_denial} with input as make_review(make_pod({"spec": {"containers": [container("main", gpu_limit)]}}), {"kind": null})
		with data.gpu_cluster.config as gate_config
}

test_allow_binding_subresource if {
	count(deny) == 0 with input as make_review(
		{"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "train-0"}, "target": {"kind": "Node", "name": "gpu-node-1"}},
		{
			"kind": {"group": "", "version": "v1", "kind": "Binding"},
			"resource": {"group": "", "version": "v1", "resource": "pods"},
			"subResource": "binding",
		},
	)
		with data.gpu_cluster.config as gate_config
}

# Pod names in messages

test_message_uses_generate_name if {
	deny == {`pod "team-a/train-job-" requests nvidia.com/gpu but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as make_review(
		{"metadata": {"generateName": "train-job-", "namespace": "team-a"}, "spec": {"containers": [container("main", gpu_limit)]}},
		{},
	)
		with data.gpu_cluster.config as gate_config
}

test_message_uses_request_namespace if {
	deny == {`pod "team-b/train-0" requests nvidia.com/gpu but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as make_review(
		{"metadata": {"name": "train-0"}, "spec": {"containers": [container("main", gpu_limit)]}},
		{"namespace": "team-b"},
	)
		with data.gpu_cluster.config as gate_config
}

test_message_for_unnamed_pod if {
	deny == {`pod "<unnamed>" requests nvidia.com/gpu but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as {"request": {
		"kind": {"kind": "Pod"},
		"operation": "CREATE",
		"object": {"spec": {"containers": [container("main", gpu_limit)]}},
	}}
		with data.gpu_cluster.config as gate_config
}

# Configuration (fail closed for GPU pods, never for the rest)

test_deny_gpu_pod_when_config_missing if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but the GPU scheduler gate is not configured (the parameter document is missing or not an object); GPU pods are refused until it is`} with input as gpu_pod_review(binpack)
}

test_allow_cpu_pod_when_config_missing if {
	count(deny) == 0 with input as review_of({})
}

test_deny_gpu_pod_when_scheduler_name_missing if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but the GPU scheduler gate is not configured (scheduler_name must be a non-empty string); GPU pods are refused until it is`} with input as gpu_pod_review(binpack)
		with data.gpu_cluster.config as object.remove(gate_config, ["scheduler_name"])
}

test_deny_gpu_pod_when_config_lists_malformed if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but the GPU scheduler gate is not configured (gpu_resource_prefixes must be a comma-separated list of non-empty strings; gpu_resources must be a comma-separated list of non-empty strings); GPU pods are refused until it is`} with input as gpu_pod_review(binpack)
		with data.gpu_cluster.config as {"scheduler_name": "gpu-binpack-scheduler", "gpu_resources": ["nvidia.com/gpu"], "gpu_resource_prefixes": ","}
}

test_empty_prefix_never_gates_cpu if {
	count(deny) == 0 with input as review_of({})
		with data.gpu_cluster.config as object.union(gate_config, {"gpu_resource_prefixes": "nvidia.com/mig-,"})
}

test_config_errors_empty_for_valid_config if {
	count(config_errors) == 0 with data.gpu_cluster.config as gate_config
}

test_config_lists_are_optional if {
	count(config_errors) == 0 with data.gpu_cluster.config as {"scheduler_name": "gpu-binpack-scheduler"}
}

test_config_that_is_not_an_object_is_an_error if {
	config_errors == {"the parameter document is missing or not an object"} with data.gpu_cluster.config as "gpu-binpack-scheduler"
}

# A pod created bound to a node

preset_node_denial := `pod "team-a/train-0" requests nvidia.com/gpu but sets spec.nodeName, which skips the scheduler; GPU pods are placed by gpu-binpack-scheduler`

test_deny_gpu_pod_created_bound_to_a_node if {
	deny == {preset_node_denial} with input as gpu_pod_review(object.union(binpack, {"nodeName": "gpu-1"}))
		with data.gpu_cluster.config as gate_config
}

test_deny_unscheduled_gpu_pod_bound_to_a_node_once if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"nodeName": "gpu-1"})
		with data.gpu_cluster.config as gate_config
}

# Mirror pods of static pods: as the kubelet writes them and NodeRestriction admits them.

node_user(node) := {"username": sprintf("system:node:%s", [node]), "groups": ["system:nodes", "system:authenticated"]}

node_owner(node) := {"apiVersion": "v1", "kind": "Node", "name": node, "uid": "0b7c6f1e-3d0a-4c55-9d3e-1a2b3c4d5e6f", "controller": true}

# A static GPU pod's mirror on node gpu-1 (schedulerName left as the API server defaults it).
mirror_pod_of(node, overrides) := make_pod(object.union(
	{
		"metadata": {
			"annotations": {"kubernetes.io/config.mirror": "6a1f2c0d9e8b7a65"},
			"ownerReferences": [node_owner(node)],
		},
		"spec": {"schedulerName": "default-scheduler", "nodeName": node, "containers": [container("main", gpu_limit)]},
	},
	overrides,
))

mirror_review(pod_object, user) := make_review(pod_object, {"userInfo": user})

test_allow_mirror_pod_created_by_its_node if {
	count(deny) == 0 with input as mirror_review(mirror_pod_of("gpu-1", {}), node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_allow_mirror_pod_that_sets_nvidia_visible_devices if {
	pod_object := mirror_pod_of("gpu-1", {"spec": {"containers": [object.union(container("main", cpu_only), {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})]}})
	count(deny) == 0 with input as mirror_review(pod_object, node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_annotation_on_a_pod_a_user_creates if {
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is "default-scheduler"; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as mirror_review(mirror_pod_of("gpu-1", {}), {"username": "alice", "groups": ["system:authenticated"]})
		with data.gpu_cluster.config as gate_config
}

test_deny_bound_pod_a_node_creates_without_the_mirror_annotation if {
	pod_object := make_pod({"spec": {"schedulerName": "gpu-binpack-scheduler", "nodeName": "gpu-1", "containers": [container("main", gpu_limit)]}})
	deny == {preset_node_denial} with input as mirror_review(pod_object, node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_pod_from_a_user_named_like_a_node_outside_system_nodes if {
	count(deny) == 1 with input as mirror_review(mirror_pod_of("gpu-1", {}), {"username": "system:node:gpu-1", "groups": ["system:authenticated"]})
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_pod_a_node_creates_for_another_node if {
	count(deny) == 1 with input as mirror_review(mirror_pod_of("gpu-2", {}), node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_pod_owned_by_another_node if {
	pod_object := mirror_pod_of("gpu-1", {"metadata": {"ownerReferences": [node_owner("gpu-2")]}})
	count(deny) == 1 with input as mirror_review(pod_object, node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_pod_without_its_node_as_owner if {
	pod_object := json.remove(mirror_pod_of("gpu-1", {}), ["metadata/ownerReferences"])
	count(deny) == 1 with input as mirror_review(pod_object, node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_pod_whose_node_owner_is_not_its_controller if {
	pod_object := mirror_pod_of("gpu-1", {"metadata": {"ownerReferences": [object.union(node_owner("gpu-1"), {"controller": false})]}})
	count(deny) == 1 with input as mirror_review(pod_object, node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_deny_mirror_pod_with_a_second_owner if {
	second := {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "5d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"}
	pod_object := mirror_pod_of("gpu-1", {"metadata": {"ownerReferences": [node_owner("gpu-1"), second]}})
	count(deny) == 1 with input as mirror_review(pod_object, node_user("gpu-1"))
		with data.gpu_cluster.config as gate_config
}

test_allow_cpu_pod_created_bound_to_a_node if {
	count(deny) == 0 with input as review_of({"spec": {"nodeName": "cpu-1"}})
		with data.gpu_cluster.config as gate_config
}

# DRA resource claims

claim_denial(claim) := sprintf(`pod "team-a/train-0" requests resource claim %s but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`, [claim])

test_deny_resource_claim_template_off_the_scheduler if {
	deny == {claim_denial("gpu")} with input as review_of({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}})
		with data.gpu_cluster.config as gate_config
}

test_deny_resource_claim_off_the_scheduler if {
	deny == {claim_denial("shared")} with input as review_of({"spec": {"resourceClaims": [{"name": "shared", "resourceClaimName": "team-gpus"}]}})
		with data.gpu_cluster.config as gate_config
}

test_allow_resource_claim_on_the_scheduler if {
	count(deny) == 0 with input as review_of({"spec": {"schedulerName": "gpu-binpack-scheduler", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}})
		with data.gpu_cluster.config as gate_config
}

test_allow_empty_resource_claims if {
	count(deny) == 0 with input as review_of({"spec": {"resourceClaims": []}})
		with data.gpu_cluster.config as gate_config
}

test_deny_unnamed_resource_claim if {
	deny == {claim_denial("<unnamed>")} with input as review_of({"spec": {"resourceClaims": [{"resourceClaimName": "team-gpus"}]}})
		with data.gpu_cluster.config as gate_config
}

# The GPU Operator's own pods

operator_config := object.union(gate_config, {
	"operator_pods.namespace": "gpu-operator",
	"operator_pods.creators": "system:serviceaccount:gpu-operator:nvidia-operator-validator",
	"operator_pods.daemonset_controllers": "system:kube-controller-manager,system:serviceaccount:kube-system:daemon-set-controller",
})

validator := {"username": "system:serviceaccount:gpu-operator:nvidia-operator-validator", "groups": ["system:serviceaccounts"]}

daemonset_controller := {"username": "system:serviceaccount:kube-system:daemon-set-controller", "groups": ["system:serviceaccounts"]}

daemonset_owner := {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset", "uid": "5d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6", "controller": true}

# The validator's device-plugin workload: a GPU limit, bound to its node, default scheduler.
plugin_validator_pod(namespace) := make_pod({
	"metadata": {"name": "nvidia-device-plugin-validator-x7k2p", "namespace": namespace},
	"spec": {
		"nodeName": "gpu-1",
		"initContainers": [container("plugin-validation", gpu_limit)],
		"containers": [container("nvidia-device-plugin-validator", cpu_only)],
	},
})

visible_devices_all := [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]

# The device plugin's DaemonSet pod: privileged, NVIDIA_VISIBLE_DEVICES=all, no GPU request.
operand_pod(namespace, owners) := make_pod({
	"metadata": {"name": "nvidia-device-plugin-daemonset-q8l4z", "namespace": namespace, "ownerReferences": owners},
	"spec": {"containers": [object.union(container("nvidia-device-plugin", {}), {"env": visible_devices_all, "securityContext": {"privileged": true}})]},
})

in_namespace(namespace, user) := {"namespace": namespace, "userInfo": user}

test_allow_the_operators_validator_workload_in_its_namespace if {
	count(deny) == 0 with input as make_review(plugin_validator_pod("gpu-operator"), in_namespace("gpu-operator", validator))
		with data.gpu_cluster.config as operator_config
}

test_deny_the_validators_identity_outside_the_operators_namespace if {
	count(deny) == 1 with input as make_review(plugin_validator_pod("team-a"), in_namespace("team-a", validator))
		with data.gpu_cluster.config as operator_config
}

test_deny_a_validator_lookalike_from_someone_else_in_the_operators_namespace if {
	count(deny) == 1 with input as make_review(plugin_validator_pod("gpu-operator"), in_namespace("gpu-operator", {"username": "alice"}))
		with data.gpu_cluster.config as operator_config
}

test_deny_the_validator_workload_without_operator_data if {
	count(deny) == 1 with input as make_review(plugin_validator_pod("gpu-operator"), in_namespace("gpu-operator", validator))
		with data.gpu_cluster.config as gate_config
}

test_allow_the_operators_daemonset_operand if {
	count(deny) == 0 with input as make_review(operand_pod("gpu-operator", [daemonset_owner]), in_namespace("gpu-operator", daemonset_controller))
		with data.gpu_cluster.config as operator_config
}

test_deny_a_daemonset_pod_with_visible_devices_in_another_namespace if {
	count(deny) == 1 with input as make_review(operand_pod("team-a", [daemonset_owner]), in_namespace("team-a", daemonset_controller))
		with data.gpu_cluster.config as operator_config
}

test_deny_a_controller_pod_in_the_operators_namespace_not_owned_by_a_daemonset if {
	replica_set := object.union(daemonset_owner, {"kind": "ReplicaSet"})
	count(deny) == 1 with input as make_review(operand_pod("gpu-operator", [replica_set]), in_namespace("gpu-operator", daemonset_controller))
		with data.gpu_cluster.config as operator_config
}

test_deny_a_daemonset_owner_written_by_someone_else if {
	count(deny) == 1 with input as make_review(operand_pod("gpu-operator", [daemonset_owner]), in_namespace("gpu-operator", {"username": "alice"}))
		with data.gpu_cluster.config as operator_config
}

test_malformed_operator_pods_are_a_config_error if {
	config_errors == {"operator_pods.namespace (non-empty), operator_pods.creators and operator_pods.daemonset_controllers (comma-separated lists of non-empty strings) must be set together"} with data.gpu_cluster.config as object.union(gate_config, {"operator_pods.namespace": "", "operator_pods.creators": "x"})
}

test_malformed_operator_pods_exempt_nobody if {
	config := object.union(gate_config, {"operator_pods.namespace": "gpu-operator", "operator_pods.creators": "system:serviceaccount:gpu-operator:nvidia-operator-validator"})
	count(deny) == 1 with input as make_review(plugin_validator_pod("gpu-operator"), in_namespace("gpu-operator", validator))
		with data.gpu_cluster.config as config
}

# NVIDIA_VISIBLE_DEVICES without a GPU request

with_env(name, resources, env) := object.union(container(name, resources), {"env": env})

visible_devices_denial(name) := sprintf(`pod "team-a/train-0" sets NVIDIA_VISIBLE_DEVICES in container "%s" without requesting a GPU; a container that requests none may only set it to void or none`, [name])

tolerates_pool := [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

test_deny_visible_devices_all_without_a_gpu if {
	deny == {visible_devices_denial("main")} with input as review_of({"spec": {"tolerations": tolerates_pool, "containers": [with_env("main", cpu_only, visible_devices_all)]}})
		with data.gpu_cluster.config as gate_config
}

test_deny_visible_devices_in_an_init_container if {
	deny == {visible_devices_denial("warmup")} with input as review_of({"spec": {
		"containers": [container("main", cpu_only)],
		"initContainers": [with_env("warmup", cpu_only, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-6c1e3f0a"}])],
	}})
		with data.gpu_cluster.config as gate_config
}

test_deny_visible_devices_in_an_ephemeral_container if {
	deny == {visible_devices_denial("debug")} with input as review_of({"spec": {
		"containers": [container("main", cpu_only)],
		"ephemeralContainers": [with_env("debug", {}, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}])],
	}})
		with data.gpu_cluster.config as gate_config
}

test_deny_visible_devices_from_elsewhere if {
	from_config_map := [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "visible"}}}]
	deny == {visible_devices_denial("main")} with input as review_of({"spec": {"containers": [with_env("main", cpu_only, from_config_map)]}})
		with data.gpu_cluster.config as gate_config
}

test_deny_visible_devices_in_a_container_beside_the_gpu_one if {
	deny == {visible_devices_denial("sidecar")} with input as gpu_pod_review(object.union(binpack, {"containers": [
		container("main", gpu_limit),
		with_env("sidecar", cpu_only, visible_devices_all),
	]}))
		with data.gpu_cluster.config as gate_config
}

test_deny_visible_devices_next_to_zero_gpus if {
	deny == {visible_devices_denial("main")} with input as review_of({"spec": {"containers": [with_env("main", {"limits": {"nvidia.com/gpu": "0"}}, visible_devices_all)]}})
		with data.gpu_cluster.config as gate_config
}

test_allow_visible_devices_that_name_no_device if {
	every value in ["void", "none", ""] {
		count(deny) == 0 with input as review_of({"spec": {"containers": [with_env("main", cpu_only, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])]}})
			with data.gpu_cluster.config as gate_config
	}
}

test_allow_visible_devices_without_a_value if {
	count(deny) == 0 with input as review_of({"spec": {"containers": [with_env("main", cpu_only, [{"name": "NVIDIA_VISIBLE_DEVICES"}])]}})
		with data.gpu_cluster.config as gate_config
}

test_allow_visible_devices_in_a_container_that_requests_a_gpu if {
	count(deny) == 0 with input as gpu_pod_review(object.union(binpack, {"containers": [with_env("main", gpu_limit, visible_devices_all)]}))
		with data.gpu_cluster.config as gate_config
}

test_allow_visible_devices_in_a_container_with_a_resource_claim if {
	claim := {"limits": {"cpu": "1"}, "claims": [{"name": "gpu"}]}
	count(deny) == 0 with input as review_of({"spec": {
		"schedulerName": "gpu-binpack-scheduler",
		"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
		"containers": [with_env("main", claim, visible_devices_all)],
	}})
		with data.gpu_cluster.config as gate_config
}

test_allow_other_variables if {
	count(deny) == 0 with input as review_of({"spec": {"containers": [with_env("main", cpu_only, [{"name": "CUDA_VISIBLE_DEVICES", "value": "all"}])]}})
		with data.gpu_cluster.config as gate_config
}

test_visible_devices_are_judged_without_gate_data if {
	deny == {visible_devices_denial("main")} with input as review_of({"spec": {"containers": [with_env("main", cpu_only, visible_devices_all)]}})
		with data.gpu_cluster.config as {}
}

# Ephemeral containers added to a running pod (`kubectl debug`): an UPDATE of the
# pods/ephemeralcontainers subresource whose object is the whole pod, oldObject the pod before.

debug_container(name, env) := {"name": name, "image": "registry.example/debug:1", "env": env}

# team-a/train-0 running on gpu-1 on the binpack scheduler, with `ephemeral` added by then.
running_gpu_pod(ephemeral) := make_pod({"spec": {
	"schedulerName": "gpu-binpack-scheduler",
	"nodeName": "gpu-1",
	"containers": [container("main", gpu_limit)],
	"ephemeralContainers": ephemeral,
}})

debug_review(before, after) := make_review(running_gpu_pod(after), {
	"operation": "UPDATE",
	"subResource": "ephemeralcontainers",
	"oldObject": running_gpu_pod(before),
})

test_deny_visible_devices_in_an_added_ephemeral_container if {
	deny == {visible_devices_denial("debugger")} with input as debug_review([], [debug_container("debugger", visible_devices_all)])
		with data.gpu_cluster.config as gate_config
}

test_deny_visible_devices_from_elsewhere_in_an_added_ephemeral_container if {
	from_secret := [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {"name": "gpus", "key": "visible"}}}]
	deny == {visible_devices_denial("debugger")} with input as debug_review([], [debug_container("debugger", from_secret)])
		with data.gpu_cluster.config as gate_config
}

# The running GPU pod is bound to its node: only what the update adds is judged.
test_allow_an_added_ephemeral_container_without_visible_devices if {
	count(deny) == 0 with input as debug_review([], [debug_container("debugger", [{"name": "TERM", "value": "xterm"}])])
		with data.gpu_cluster.config as gate_config
}

test_allow_an_added_ephemeral_container_that_names_no_device if {
	count(deny) == 0 with input as debug_review([], [debug_container("debugger", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])])
		with data.gpu_cluster.config as gate_config
}

# One admitted before the gate existed stays; the update is judged on what it adds.
test_judge_only_the_ephemeral_containers_an_update_adds if {
	before := [debug_container("debugger-old", visible_devices_all)]
	after := array.concat(before, [debug_container("debugger-new", [])])
	count(deny) == 0 with input as debug_review(before, after)
		with data.gpu_cluster.config as gate_config
}

test_deny_an_added_ephemeral_container_beside_an_earlier_one if {
	before := [debug_container("debugger-old", [])]
	after := array.concat(before, [debug_container("debugger-new", visible_devices_all)])
	deny == {visible_devices_denial("debugger-new")} with input as debug_review(before, after)
		with data.gpu_cluster.config as gate_config
}

# Without the pod before, every ephemeral container counts as added (fail closed).
test_deny_ephemeral_visible_devices_when_the_old_pod_is_missing if {
	review := make_review(running_gpu_pod([debug_container("debugger", visible_devices_all)]), {"operation": "UPDATE", "subResource": "ephemeralcontainers"})
	deny == {visible_devices_denial("debugger")} with input as review
		with data.gpu_cluster.config as gate_config
}

# A running pod with DRA claims is not judged again for its claims or its node.
test_allow_debugging_a_running_pod_with_resource_claims if {
	pod := make_pod({"spec": {
		"nodeName": "gpu-1",
		"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
		"containers": [container("main", {"claims": [{"name": "gpu"}]})],
		"ephemeralContainers": [debug_container("debugger", [])],
	}})
	count(deny) == 0 with input as make_review(pod, {"operation": "UPDATE", "subResource": "ephemeralcontainers", "oldObject": object.union(pod, {"spec": {"ephemeralContainers": []}})})
		with data.gpu_cluster.config as gate_config
}

# Other subresource updates (status) carry no new container.
test_allow_status_update_of_a_pod_with_visible_devices if {
	pod := review_of({"spec": {"containers": [with_env("main", cpu_only, visible_devices_all)]}}).request.object
	count(deny) == 0 with input as make_review(pod, {"operation": "UPDATE", "subResource": "status", "oldObject": pod})
		with data.gpu_cluster.config as gate_config
}

# Pool pods: in the pool's namespaces (team-a here), whatever tolerates the GPU pool's taint is
# placed by the binpack scheduler alone.

fenced_config := object.union(gate_config, {
	"pool_pods.taint.key": "nvidia.com/gpu",
	"pool_pods.taint.value": "present",
	"pool_pods.taint.effect": "NoSchedule",
	"pool_pods.daemonset_controllers": "system:kube-controller-manager,system:serviceaccount:kube-system:daemon-set-controller",
	"pool_nodes": "gpu-1,gpu-2",
})

pool_config := object.union(fenced_config, {"pool_namespaces": "team-a"})

# team-a/train-0 with one CPU-only container and `tolerations`; spec overrides merge in.
pool_pod_review(tolerations, spec_overrides) := review_of({"spec": object.union({"tolerations": tolerations}, spec_overrides)})

pool_denial(scheduler) := sprintf(`pod "team-a/train-0" tolerates the GPU pool's taint nvidia.com/gpu but spec.schedulerName is %s; pods that tolerate it must set spec.schedulerName: gpu-binpack-scheduler (one scheduler places every pod on the pool's nodes)`, [scheduler])

test_deny_a_cpu_pod_that_tolerates_the_pool_off_the_scheduler if {
	deny == {pool_denial(`"default-scheduler"`)} with input as pool_pod_review(tolerates_pool, {"schedulerName": "default-scheduler"})
		with data.gpu_cluster.config as pool_config
}

test_deny_a_pool_pod_on_another_scheduler if {
	deny == {pool_denial(`"team-scheduler"`)} with input as pool_pod_review(tolerates_pool, {"schedulerName": "team-scheduler"})
		with data.gpu_cluster.config as pool_config
}

test_allow_a_pool_pod_on_the_scheduler if {
	count(deny) == 0 with input as pool_pod_review(tolerates_pool, binpack)
		with data.gpu_cluster.config as pool_config
}

test_deny_each_toleration_that_tolerates_the_pool_taint if {
	every toleration in [
		{"key": "nvidia.com/gpu", "operator": "Exists"},
		{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
		{"key": "nvidia.com/gpu", "value": "present"},
		{"key": "nvidia.com/gpu", "operator": "", "value": "present", "effect": ""},
	] {
		deny == {pool_denial("unset")} with input as pool_pod_review([toleration], {})
			with data.gpu_cluster.config as pool_config
	}
}

test_allow_tolerations_that_do_not_tolerate_the_pool_taint if {
	every toleration in [
		{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
		{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
		{"key": "nvidia.com/gpu", "operator": "Lt", "value": "present"},
		{"key": "example.com/dongle", "operator": "Exists"},
	] {
		count(deny) == 0 with input as pool_pod_review([toleration], {})
			with data.gpu_cluster.config as pool_config
	}
}

# Infrastructure that tolerates every taint is not a pool pod.
test_allow_a_pod_that_tolerates_every_taint if {
	count(deny) == 0 with input as pool_pod_review([{"operator": "Exists"}], {})
		with data.gpu_cluster.config as pool_config
}

test_deny_a_pool_pod_that_also_tolerates_every_taint if {
	deny == {pool_denial("unset")} with input as pool_pod_review(array.concat([{"operator": "Exists"}], tolerates_pool), {})
		with data.gpu_cluster.config as pool_config
}

test_allow_the_daemonset_controllers_pool_pod if {
	pod := make_pod({"metadata": {"ownerReferences": [daemonset_owner]}, "spec": {"tolerations": tolerates_pool}})
	count(deny) == 0 with input as make_review(pod, in_namespace("team-a", daemonset_controller))
		with data.gpu_cluster.config as pool_config
}

test_deny_a_daemonset_owner_on_a_pool_pod_someone_else_creates if {
	pod := make_pod({"metadata": {"ownerReferences": [daemonset_owner]}, "spec": {"tolerations": tolerates_pool}})
	deny == {pool_denial("unset")} with input as make_review(pod, in_namespace("team-a", {"username": "alice"}))
		with data.gpu_cluster.config as pool_config
}

test_deny_a_pool_pod_the_replicaset_controller_creates if {
	replica_set := object.union(daemonset_owner, {"kind": "ReplicaSet"})
	pod := make_pod({"metadata": {"ownerReferences": [replica_set]}, "spec": {"tolerations": tolerates_pool}})
	deny == {pool_denial("unset")} with input as make_review(pod, in_namespace("team-a", daemonset_controller))
		with data.gpu_cluster.config as pool_config
}

test_allow_a_pool_pod_created_bound_to_a_node if {
	count(deny) == 0 with input as pool_pod_review(tolerates_pool, {"nodeName": "gpu-1"})
		with data.gpu_cluster.config as pool_config
}

test_a_gpu_pool_pod_is_judged_as_a_gpu_pod if {
	deny == {unset_gpu_denial} with input as gpu_pod_review({"tolerations": tolerates_pool})
		with data.gpu_cluster.config as pool_config
}

test_allow_a_pool_pod_without_pool_data if {
	count(deny) == 0 with input as pool_pod_review(tolerates_pool, {})
		with data.gpu_cluster.config as gate_config
}

test_pool_taint_key_comes_from_the_data if {
	config := object.union(pool_config, {"pool_pods.taint.key": "gpu-cluster.io/pool", "pool_pods.taint.value": "a100", "pool_pods.taint.effect": "PreferNoSchedule"})
	count(deny) == 0 with input as pool_pod_review(tolerates_pool, {})
		with data.gpu_cluster.config as config
	count(deny) == 1 with input as pool_pod_review([{"key": "gpu-cluster.io/pool", "value": "a100"}], {})
		with data.gpu_cluster.config as config
}

test_allow_a_running_pool_pod_being_debugged if {
	pod := make_pod({"spec": {"nodeName": "gpu-1", "tolerations": tolerates_pool, "ephemeralContainers": [debug_container("debugger", [])]}})
	count(deny) == 0 with input as make_review(pod, {"operation": "UPDATE", "subResource": "ephemeralcontainers", "oldObject": object.union(pod, {"spec": {"ephemeralContainers": []}})})
		with data.gpu_cluster.config as pool_config
}

# The pool's nodes take GPU pods, and pods in pool_namespaces or of pool_daemonsets: elsewhere
# a pod that asks for no GPU may neither be bound to one nor tolerate the pool's taint.

fence_suffix := "; the pool's nodes take GPU pods, and pods in namespaces: monitoring, and pods of DaemonSets: logging/agent"

outside_config := object.union(fenced_config, {"pool_namespaces": "monitoring", "pool_daemonsets": "logging/agent"})

fence_toleration_denial := sprintf(`pod "team-a/train-0" asks for no GPU but tolerates the GPU pool's taint nvidia.com/gpu%s`, [fence_suffix])

fence_node_denial(node) := sprintf(`pod "team-a/train-0" asks for no GPU but spec.nodeName is %s, a node of the GPU pool%s`, [node, fence_suffix])

test_deny_each_toleration_of_the_pool_taint_outside_the_pools_namespaces if {
	every toleration in [
		{"key": "nvidia.com/gpu", "operator": "Exists"},
		{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
		{"operator": "Exists"},
		{"operator": "Exists", "effect": "NoSchedule"},
		{"key": "", "operator": "Exists"},
	] {
		every scheduler in [{}, binpack, {"schedulerName": "default-scheduler"}] {
			deny == {fence_toleration_denial} with input as pool_pod_review([toleration], scheduler)
				with data.gpu_cluster.config as outside_config
		}
	}
}

test_allow_tolerations_of_other_taints_outside_the_pools_namespaces if {
	every toleration in [
		{"operator": "Exists", "effect": "NoExecute"},
		{"key": "nvidia.com/gpu", "value": "absent"},
		{"key": "example.com/other", "operator": "Exists"},
		{"operator": "Equal"},
	] {
		count(deny) == 0 with input as pool_pod_review([toleration], {})
			with data.gpu_cluster.config as outside_config
	}
}

test_deny_a_cpu_pod_bound_to_a_pool_node if {
	deny == {fence_node_denial("gpu-2")} with input as review_of({"spec": {"nodeName": "gpu-2"}})
		with data.gpu_cluster.config as outside_config
	deny == {fence_node_denial("gpu-1")} with input as pool_pod_review([{"operator": "Exists"}], {"nodeName": "gpu-1"})
		with data.gpu_cluster.config as outside_config
}

test_allow_a_cpu_pod_bound_to_another_node_whatever_it_tolerates if {
	count(deny) == 0 with input as pool_pod_review([{"operator": "Exists"}], {"nodeName": "cpu-1"})
		with data.gpu_cluster.config as outside_config
}

test_allow_pods_on_the_pool_in_its_namespaces if {
	count(deny) == 0 with input as make_review(make_pod({"metadata": {"namespace": "monitoring"}, "spec": {"nodeName": "gpu-1", "tolerations": [{"operator": "Exists"}]}}), {"namespace": "monitoring"})
		with data.gpu_cluster.config as outside_config
}

test_allow_the_listed_daemonsets_pods_only_from_the_daemonset_controller if {
	owner := object.union(daemonset_owner, {"name": "agent"})
	pod := make_pod({"metadata": {"namespace": "logging", "ownerReferences": [owner]}, "spec": {"tolerations": [{"operator": "Exists"}]}})
	count(deny) == 0 with input as make_review(pod, in_namespace("logging", daemonset_controller))
		with data.gpu_cluster.config as outside_config
	count(deny) == 1 with input as make_review(pod, in_namespace("logging", {"username": "alice"}))
		with data.gpu_cluster.config as outside_config
	count(deny) == 1 with input as make_review(pod, in_namespace("team-a", daemonset_controller))
		with data.gpu_cluster.config as outside_config
	other := make_pod({"metadata": {"namespace": "logging", "ownerReferences": [daemonset_owner]}, "spec": {"tolerations": [{"operator": "Exists"}]}})
	count(deny) == 1 with input as make_review(other, in_namespace("logging", daemonset_controller))
		with data.gpu_cluster.config as outside_config
}

test_a_gpu_pod_may_tolerate_the_pool_anywhere if {
	count(deny) == 0 with input as gpu_pod_review(object.union(binpack, {"tolerations": [{"operator": "Exists"}]}))
		with data.gpu_cluster.config as outside_config
}

# UPDATE of the pod: tolerations may only grow, and a Pending pod is placed again with them.
toleration_update(old_tolerations, new_tolerations, spec_overrides) := make_review(
	make_pod({"spec": object.union({"tolerations": new_tolerations}, spec_overrides)}),
	{"operation": "UPDATE", "oldObject": make_pod({"spec": object.union({"tolerations": old_tolerations}, spec_overrides)})},
)

test_deny_an_update_that_adds_a_pool_toleration_to_a_pending_cpu_pod if {
	msg := sprintf(`pod "team-a/train-0" asks for no GPU but is updated to tolerate the GPU pool's taint nvidia.com/gpu%s`, [fence_suffix])
	deny == {msg} with input as toleration_update([], [{"operator": "Exists"}], {})
		with data.gpu_cluster.config as outside_config
	deny == {msg} with input as toleration_update([{"key": "a", "operator": "Exists"}], [{"key": "a", "operator": "Exists"}, tolerates_pool[0]], binpack)
		with data.gpu_cluster.config as outside_config
}

test_allow_updates_that_add_no_pool_toleration_or_to_a_bound_pod if {
	count(deny) == 0 with input as toleration_update([{"operator": "Exists"}], [{"operator": "Exists"}], {})
		with data.gpu_cluster.config as outside_config
	count(deny) == 0 with input as toleration_update([], [{"key": "a", "operator": "Exists"}], {})
		with data.gpu_cluster.config as outside_config
	count(deny) == 0 with input as toleration_update([], [{"operator": "Exists"}], {"nodeName": "cpu-1"})
		with data.gpu_cluster.config as outside_config
	count(deny) == 0 with input as toleration_update([], [{"operator": "Exists"}], {})
		with data.gpu_cluster.config as pool_config
}

test_an_update_of_a_subresource_is_not_a_toleration_update if {
	review := toleration_update([], [{"operator": "Exists"}], {})
	count(deny) == 0 with input as object.union(review, {"request": {"subResource": "status"}})
		with data.gpu_cluster.config as outside_config
}

test_malformed_pool_lists_are_config_errors if {
	config_errors == {
		"pool_daemonsets must be a comma-separated list of non-empty strings",
		"pool_namespaces must be a comma-separated list of non-empty strings",
		"pool_nodes must be a comma-separated list of non-empty strings",
	} with data.gpu_cluster.config as object.union(fenced_config, {"pool_nodes": "a,", "pool_namespaces": ",b", "pool_daemonsets": "x/y,,z/w"})
}

test_malformed_pool_pods_are_a_config_error if {
	config_errors == {"pool_pods.taint.key (non-empty), pool_pods.taint.value, pool_pods.taint.effect (non-empty) and pool_pods.daemonset_controllers (a comma-separated list of non-empty strings) must be set together"} with data.gpu_cluster.config as object.union(gate_config, {"pool_pods.taint.key": "", "pool_pods.daemonset_controllers": ""})
}

# Gang pods: with gang_pods "true", every pod of a PodGroup is placed by the binpack scheduler.

gang_config := object.union(pool_config, {"gang_pods": "true"})

in_group := {"schedulingGroup": {"podGroupName": "job-7"}}

gang_denial(scheduler) := sprintf(`pod "team-a/train-0" is a member of PodGroup job-7 but spec.schedulerName is %s; pods of a PodGroup must set spec.schedulerName: gpu-binpack-scheduler (a gang on two schedulers never starts whole)`, [scheduler])

test_deny_a_cpu_gang_member_off_the_scheduler if {
	deny == {gang_denial(`"default-scheduler"`)} with input as review_of({"spec": object.union(in_group, {"schedulerName": "default-scheduler"})})
		with data.gpu_cluster.config as gang_config
	deny == {gang_denial(`"team-scheduler"`)} with input as review_of({"spec": object.union(in_group, {"schedulerName": "team-scheduler"})})
		with data.gpu_cluster.config as gang_config
}

test_allow_a_cpu_gang_member_on_the_scheduler if {
	count(deny) == 0 with input as review_of({"spec": object.union(in_group, binpack)})
		with data.gpu_cluster.config as gang_config
}

test_a_gpu_gang_member_is_judged_as_a_gpu_pod_only if {
	deny == {unset_gpu_denial} with input as gpu_pod_review(in_group)
		with data.gpu_cluster.config as gang_config
}

test_a_gang_member_tolerating_the_pool_is_judged_as_a_pool_pod_only if {
	deny == {pool_denial(`"default-scheduler"`)} with input as pool_pod_review(tolerates_pool, object.union(in_group, {"schedulerName": "default-scheduler"}))
		with data.gpu_cluster.config as gang_config
}

test_allow_gang_members_anywhere_while_gangs_are_not_the_gates if {
	count(deny) == 0 with input as review_of({"spec": object.union(in_group, {"schedulerName": "default-scheduler"})})
		with data.gpu_cluster.config as pool_config
	count(deny) == 0 with input as review_of({"spec": object.union(in_group, {"schedulerName": "default-scheduler"})})
		with data.gpu_cluster.config as object.union(pool_config, {"gang_pods": "false"})
}

test_allow_a_gang_member_created_bound_to_a_node if {
	count(deny) == 0 with input as review_of({"spec": object.union(in_group, {"nodeName": "gpu-1"})})
		with data.gpu_cluster.config as gang_config
}

test_a_malformed_gang_switch_is_a_configuration_error if {
	config_errors == {"gang_pods must be true or false"} with data.gpu_cluster.config as object.union(gate_config, {"gang_pods": "yes"})
	deny == {`pod "team-a/train-0" requests nvidia.com/gpu but the GPU scheduler gate is not configured (gang_pods must be true or false); GPU pods are refused until it is`} with input as gpu_pod_review(binpack)
		with data.gpu_cluster.config as object.union(gate_config, {"gang_pods": "yes"})
}

# gang_namespaces: only the PodGroups of those namespaces are the binpack scheduler's.

test_gang_namespaces_limit_which_podgroups_the_gate_keeps if {
	listed := object.union(gang_config, {"gang_namespaces": "team-a,team-b"})
	deny == {gang_denial(`"default-scheduler"`)} with input as review_of({"spec": object.union(in_group, {"schedulerName": "default-scheduler"})})
		with data.gpu_cluster.config as listed
	others := object.union(gang_config, {"gang_namespaces": "team-b"})
	count(deny) == 0 with input as review_of({"spec": object.union(in_group, {"schedulerName": "default-scheduler"})})
		with data.gpu_cluster.config as others
}

test_an_empty_gang_namespace_list_keeps_every_podgroup if {
	deny == {gang_denial(`"default-scheduler"`)} with input as review_of({"spec": object.union(in_group, {"schedulerName": "default-scheduler"})})
		with data.gpu_cluster.config as object.union(gang_config, {"gang_namespaces": ""})
}

test_a_gpu_gang_member_outside_the_gang_namespaces_is_still_a_gpu_pod if {
	deny == {unset_gpu_denial} with input as gpu_pod_review(in_group)
		with data.gpu_cluster.config as object.union(gang_config, {"gang_namespaces": "team-b"})
}

test_a_malformed_gang_namespace_list_is_a_configuration_error if {
	config_errors == {"gang_namespaces must be a comma-separated list of non-empty strings"} with data.gpu_cluster.config as object.union(gang_config, {"gang_namespaces": "team-a,"})
}

# The stack's PriorityClasses: only pods that ask for a GPU, or pods in the listed namespaces,
# may name them.

priority_config := object.union(gang_config, {
	"priority_classes": "gpu-batch,gpu-inference,gpu-training",
	"priority_class_namespaces": "ml-serving,web",
})

priority_message(class, allowed) := sprintf(`pod "team-a/train-0" sets spec.priorityClassName: %s but requests no GPU; the stack's PriorityClasses (gpu-batch, gpu-inference, gpu-training) are for GPU pods%s`, [class, allowed])

priority_denial(class) := priority_message(class, " and pods in namespaces: ml-serving, web")

named_class(class, spec_overrides) := object.union({"priorityClassName": class}, spec_overrides)

test_deny_a_cpu_pod_naming_a_stack_priority_class if {
	deny == {priority_denial("gpu-inference")} with input as review_of({"spec": named_class("gpu-inference", {})})
		with data.gpu_cluster.config as priority_config
}

# The stack's scheduler gives a CPU pod no right to the class.
test_deny_a_cpu_pod_naming_a_stack_priority_class_on_the_scheduler if {
	deny == {priority_denial("gpu-batch")} with input as review_of({"spec": named_class("gpu-batch", binpack)})
		with data.gpu_cluster.config as priority_config
}

test_allow_a_gpu_pod_naming_a_stack_priority_class if {
	count(deny) == 0 with input as gpu_pod_review(named_class("gpu-inference", binpack))
		with data.gpu_cluster.config as priority_config
}

test_a_gpu_pod_naming_a_stack_priority_class_is_judged_as_a_gpu_pod_only if {
	deny == {unset_gpu_denial} with input as gpu_pod_review(named_class("gpu-inference", {}))
		with data.gpu_cluster.config as priority_config
}

test_deny_zero_gpus_naming_a_stack_priority_class if {
	deny == {priority_denial("gpu-inference")} with input as gpu_pod_review(named_class("gpu-inference", object.union(binpack, {"containers": [container("main", {"limits": {"nvidia.com/gpu": "0"}})]})))
		with data.gpu_cluster.config as priority_config
}

test_deny_a_resource_that_is_no_gpu_naming_a_stack_priority_class if {
	deny == {priority_denial("gpu-training")} with input as gpu_pod_review(named_class("gpu-training", object.union(binpack, {"containers": [container("main", {"limits": {"nvidia.com/hostdev": "1"}})]})))
		with data.gpu_cluster.config as priority_config
}

test_allow_a_gpu_init_container_naming_a_stack_priority_class if {
	count(deny) == 0 with input as gpu_pod_review(named_class("gpu-training", object.union(binpack, {
		"containers": [container("main", cpu_only)],
		"initContainers": [container("warmup", gpu_limit)],
	})))
		with data.gpu_cluster.config as priority_config
}

# Every claim is a GPU request to the Rego policy (OPA is refused with DRA).
test_allow_a_resource_claim_naming_a_stack_priority_class if {
	count(deny) == 0 with input as review_of({"spec": named_class("gpu-inference", object.union(binpack, {
		"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
		"containers": [container("main", {"claims": [{"name": "gpu"}]})],
	}))})
		with data.gpu_cluster.config as priority_config
}

test_allow_a_priority_class_that_is_not_the_stacks if {
	count(deny) == 0 with input as review_of({"spec": named_class("team-high", {})})
		with data.gpu_cluster.config as priority_config
	count(deny) == 0 with input as review_of({"spec": named_class("system-cluster-critical", {})})
		with data.gpu_cluster.config as priority_config
	count(deny) == 0 with input as review_of({"spec": named_class("gpu-inference-2", {})})
		with data.gpu_cluster.config as priority_config
}

test_allow_a_stack_priority_class_in_an_allowed_namespace if {
	pod := make_pod({"metadata": {"namespace": "web"}, "spec": named_class("gpu-inference", {})})
	count(deny) == 0 with input as make_review(pod, {"namespace": "web"})
		with data.gpu_cluster.config as priority_config
}

# The request's namespace, which the API server sets, decides.
test_the_allowed_namespace_is_the_requests if {
	pod := make_pod({"metadata": {"namespace": "web"}, "spec": named_class("gpu-inference", {})})
	deny == {`pod "web/train-0" sets spec.priorityClassName: gpu-inference but requests no GPU; the stack's PriorityClasses (gpu-batch, gpu-inference, gpu-training) are for GPU pods and pods in namespaces: ml-serving, web`} with input as make_review(pod, {"namespace": "team-a"})
		with data.gpu_cluster.config as priority_config
}

test_an_allowed_namespace_lifts_no_other_rule if {
	pod := make_pod({"metadata": {"namespace": "web"}, "spec": named_class("gpu-inference", {"containers": [container("main", gpu_limit)]})})
	deny == {`pod "web/train-0" requests nvidia.com/gpu but spec.schedulerName is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler`} with input as make_review(pod, {"namespace": "web"})
		with data.gpu_cluster.config as priority_config
}

test_no_allowed_namespaces_say_so if {
	config := object.remove(priority_config, ["priority_class_namespaces"])
	deny == {priority_message("gpu-inference", " only")} with input as review_of({"spec": named_class("gpu-inference", {})})
		with data.gpu_cluster.config as config
	deny == {priority_message("gpu-inference", " only")} with input as review_of({"spec": named_class("gpu-inference", {})})
		with data.gpu_cluster.config as object.union(priority_config, {"priority_class_namespaces": ""})
}

test_allow_any_priority_class_without_the_stacks_classes if {
	count(deny) == 0 with input as review_of({"spec": named_class("gpu-inference", {})})
		with data.gpu_cluster.config as gang_config
	count(deny) == 0 with input as review_of({"spec": named_class("gpu-inference", {})})
		with data.gpu_cluster.config as object.union(gang_config, {"priority_classes": ""})
}

test_deny_a_pool_pod_naming_a_stack_priority_class if {
	deny == {priority_denial("gpu-batch")} with input as pool_pod_review(tolerates_pool, named_class("gpu-batch", binpack))
		with data.gpu_cluster.config as priority_config
	deny == {priority_denial("gpu-batch"), pool_denial(`"default-scheduler"`)} with input as pool_pod_review(tolerates_pool, named_class("gpu-batch", {"schedulerName": "default-scheduler"}))
		with data.gpu_cluster.config as priority_config
}

test_deny_a_gang_launcher_naming_a_stack_priority_class if {
	deny == {priority_denial("gpu-training")} with input as review_of({"spec": named_class("gpu-training", object.union(in_group, binpack))})
		with data.gpu_cluster.config as priority_config
}

test_allow_the_operators_pod_naming_a_stack_priority_class if {
	pod := make_pod({"metadata": {"namespace": "gpu-operator"}, "spec": named_class("gpu-inference", {})})
	config := object.union(operator_config, {"priority_classes": "gpu-inference"})
	count(deny) == 0 with input as make_review(pod, in_namespace("gpu-operator", validator))
		with data.gpu_cluster.config as config
	deny == {`pod "gpu-operator/train-0" sets spec.priorityClassName: gpu-inference but requests no GPU; the stack's PriorityClasses (gpu-inference) are for GPU pods only`} with input as make_review(pod, in_namespace("gpu-operator", daemonset_controller))
		with data.gpu_cluster.config as config
}

test_allow_a_mirror_pod_naming_a_stack_priority_class if {
	pod := mirror_pod_of("gpu-1", {"spec": named_class("gpu-inference", {})})
	count(deny) == 0 with input as mirror_review(pod, node_user("gpu-1"))
		with data.gpu_cluster.config as priority_config
}

# spec.priorityClassName cannot change after creation: updates are not judged by the rule.
test_allow_updates_of_a_pod_naming_a_stack_priority_class if {
	pod := make_pod({"spec": named_class("gpu-inference", {"nodeName": "cpu-1", "ephemeralContainers": [debug_container("debugger", [])]})})
	count(deny) == 0 with input as make_review(pod, {"operation": "UPDATE", "subResource": "ephemeralcontainers", "oldObject": object.union(pod, {"spec": {"ephemeralContainers": []}})})
		with data.gpu_cluster.config as priority_config
	count(deny) == 0 with input as make_review(pod, {"operation": "UPDATE", "oldObject": pod})
		with data.gpu_cluster.config as priority_config
}

test_malformed_priority_lists_are_configuration_errors if {
	config := object.union(gate_config, {"priority_classes": "gpu-inference,", "priority_class_namespaces": ",web"})
	config_errors == {
		"priority_class_namespaces must be a comma-separated list of non-empty strings",
		"priority_classes must be a comma-separated list of non-empty strings",
	} with data.gpu_cluster.config as config
}

# As for pool and gang pods: a malformed document fails GPU pods closed, and lets CPU pods be.
test_a_malformed_document_judges_no_priority_class if {
	config := object.union(priority_config, {"gpu_resources": "a,,b"})
	count(deny) == 0 with input as review_of({"spec": named_class("gpu-inference", {})})
		with data.gpu_cluster.config as config
}

test_a_priority_class_beside_visible_devices_gets_both_messages if {
	deny == {priority_denial("gpu-inference"), visible_devices_denial("main")} with input as review_of({"spec": named_class("gpu-inference", {"containers": [with_env("main", cpu_only, visible_devices_all)]})})
		with data.gpu_cluster.config as priority_config
}
