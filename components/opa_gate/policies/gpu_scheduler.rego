# Keeps GPU pods on the binpack scheduler.
#
# A pod CREATE is denied when any container, initContainer or ephemeralContainer
# (or the pod-level spec.resources) requests or limits a GPU resource, or the pod asks for
# devices through DRA resource claims (spec.resourceClaims), and
# spec.schedulerName is not the configured binpack scheduler, or spec.nodeName is already
# set (a pod created bound to a node is never scheduled, whatever its schedulerName).
# It is denied too when a container sets NVIDIA_VISIBLE_DEVICES (to anything but void or
# none) without requesting a GPU itself: the container toolkit may give it every GPU of its
# node. That rule also judges the ephemeral containers an UPDATE of the pods/ephemeralcontainers
# subresource adds to a running pod (`kubectl debug --env NVIDIA_VISIBLE_DEVICES=all`).
# A pod CREATE that asks for no GPU but tolerates the GPU pool's taint with a toleration naming
# its key (a pool pod: the default scheduler could place it on the pool beside the GPU pods the
# binpack scheduler places there, each seeing room the other has just taken) is denied too off
# the binpack scheduler, unless it is created bound to a node or by the DaemonSet controller
# for a DaemonSet (pool_pods.* of data.gpu_cluster.config).
# With gang_pods "true" (the stack's scheduler places gangs), a pod CREATE of a PodGroup
# (spec.schedulingGroup) that asks for no GPU and is no pool pod, a launcher say, is denied off
# the binpack scheduler too: a gang whose members go to two schedulers never starts whole, and
# admission cannot see whether the group's other pods ask for GPUs.
# With priority_classes (the stack's PriorityClasses, layer 8), a pod CREATE that names one of
# them in spec.priorityClassName but asks for no GPU is denied, unless its namespace is one of
# priority_class_namespaces: those classes preempt other pods, and are for GPU work only.
# A pod that asks for no GPU is denied too when it would run on the GPU pool's nodes: created
# bound to one of pool_nodes, or tolerating the pool's taint (naming its key, or every key) while
# bound to none, when created or added by an UPDATE of the pod (tolerations may grow, and a
# Pending pod is placed again with them); unless its namespace is one of pool_namespaces, or it
# is a pod of one of pool_daemonsets (namespace/name) created by the DaemonSet controller.
# Not judged: a node's mirror pods of its static pods, and the GPU Operator's own pods
# (operator_pods.* of data.gpu_cluster.config).
#
# Input: an admission.k8s.io/v1 AdmissionReview (input.request).
# Data:  data.gpu_cluster.config, the parameter document, see README.md. Missing or malformed
#        configuration fails closed: GPU pods are denied, other pods are not.
package gpu_cluster.gpu_scheduler

# Gated whatever the configuration says; configured names and prefixes add to these.
baseline_gpu_resources := {"nvidia.com/gpu"}

# MIG profiles are advertised as nvidia.com/mig-<profile>, e.g. nvidia.com/mig-1g.5gb.
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html
baseline_gpu_resource_prefixes := {"nvidia.com/mig-"}

config_lists := [
	"gpu_resources", "gpu_resource_prefixes", "priority_classes", "priority_class_namespaces",
	"gang_namespaces", "pool_nodes", "pool_namespaces", "pool_daemonsets",
]

operator_keys := ["operator_pods.namespace", "operator_pods.creators", "operator_pods.daemonset_controllers"]

pool_keys := ["pool_pods.taint.key", "pool_pods.taint.value", "pool_pods.taint.effect", "pool_pods.daemonset_controllers"]

# The API server refuses resources on ephemeral containers and on CREATE refuses them
# altogether; they are scanned anyway, as nothing may hide a GPU request.
# Ref: https://kubernetes.io/docs/concepts/workloads/pods/ephemeral-containers/
container_fields := ["containers", "initContainers", "ephemeralContainers"]

# Configuration: one parameter document of string keys and values (README.md, "Data
# contract"), the native policies' params ConfigMap data. Lists are comma-separated.

config := data.gpu_cluster.config

configured_scheduler_name := name if {
	name := config.scheduler_name
	is_string(name)
	name != ""
}

# Negation goes through helper rules: `not is_object(x)` with x undefined is itself
# undefined, because the argument is evaluated outside the `not`.
config_is_object if is_object(config)

config_errors contains "the parameter document is missing or not an object" if not config_is_object

config_errors contains "scheduler_name must be a non-empty string" if {
	config_is_object
	not configured_scheduler_name
}

config_errors contains sprintf("%s must be a comma-separated list of non-empty strings", [key]) if {
	some key in config_lists
	value := config[key]
	not valid_list(value)
}

config_errors contains "operator_pods.namespace (non-empty), operator_pods.creators and operator_pods.daemonset_controllers (comma-separated lists of non-empty strings) must be set together" if {
	some key in operator_keys
	config[key]
	not valid_operator_pods
}

config_errors contains "pool_pods.taint.key (non-empty), pool_pods.taint.value, pool_pods.taint.effect (non-empty) and pool_pods.daemonset_controllers (a comma-separated list of non-empty strings) must be set together" if {
	some key in pool_keys
	config[key]
	not valid_pool_pods
}

config_errors contains "gang_pods must be true or false" if {
	some value in [config.gang_pods]
	not value in {"", "true", "false"}
}

# The items of a comma-separated list; "" is the empty list.
list_items(value) := [] if value == ""

list_items(value) := split(value, ",") if {
	is_string(value)
	value != ""
}

valid_list(value) if {
	items := list_items(value)
	every item in items {
		item != ""
	}
}

non_empty_string(value) if {
	is_string(value)
	value != ""
}

valid_operator_pods if {
	non_empty_string(config["operator_pods.namespace"])
	valid_list(config["operator_pods.creators"])
	valid_list(config["operator_pods.daemonset_controllers"])
}

valid_pool_pods if {
	non_empty_string(config["pool_pods.taint.key"])
	is_string(config["pool_pods.taint.value"])
	non_empty_string(config["pool_pods.taint.effect"])
	valid_list(config["pool_pods.daemonset_controllers"])
}

gpu_resources := baseline_gpu_resources | {name |
	some name in list_items(config.gpu_resources)
	name != ""
}

# An empty prefix would match every resource, cpu included; it is reported above, never used.
gpu_resource_prefixes := baseline_gpu_resource_prefixes | {prefix |
	some prefix in list_items(config.gpu_resource_prefixes)
	prefix != ""
}

gpu_resource(name) if name in gpu_resources

gpu_resource(name) if {
	some prefix in gpu_resource_prefixes
	startswith(name, prefix)
}

# The request

request := input.request

pod := request.object

spec := pod.spec

spec_is_object if is_object(spec)

# schedulerName and extended resources cannot change after creation, so the GPU rules judge
# only CREATE. Either the kind or the resource naming a pod is enough; subresources
# (pods/binding, pods/eviction) carry other objects and are not pod creations.
pod_create if {
	request.operation == "CREATE"
	pod_kind
	not subresource_request
}

# Containers join a running pod only as ephemeral containers, through an UPDATE of its
# ephemeralcontainers subresource, whose object is the whole pod (oldObject the pod before).
# Ref: https://kubernetes.io/docs/concepts/workloads/pods/ephemeral-containers/
ephemeral_containers_update if {
	request.operation == "UPDATE"
	pod_kind
	request.subResource == "ephemeralcontainers"
}

subresource_request if {
	is_string(request.subResource)
	request.subResource != ""
}

pod_kind if request.kind.kind == "Pod"

# An UPDATE of the pod itself, not of a subresource: its tolerations may have grown.
# Ref: https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement
pod_update if {
	request.operation == "UPDATE"
	pod_kind
	not subresource_request
}

pod_kind if request.resource.resource == "pods"

# Resources

resource_blocks contains block if {
	some field in container_fields
	some container in spec[field]
	block := container.resources
}

# Pod-level resources are scanned too; Kubernetes accepts only cpu, memory and
# hugepages there today, so a GPU found there is denied like any other.
# Ref: https://kubernetes.io/docs/tasks/configure-pod-container/assign-pod-level-resources/
resource_blocks contains spec.resources

# A GPU resource counts unless its quantity is provably zero; Kubernetes does not
# allocate a device for a quantity of 0. Unparsable quantities count (fail closed).
requested_gpu_resources contains name if {
	some block in resource_blocks
	some section in ["requests", "limits"]
	some name, quantity in block[section]
	is_string(name)
	gpu_resource(name)
	not zero_quantity(quantity)
}

# Devices asked for through Dynamic Resource Allocation (resource.k8s.io/v1, GA since 1.34):
# each pod-level claim, whether it names a ResourceClaim or a ResourceClaimTemplate. The
# claim's device class is in another object, out of admission's reach, so every claim counts.
# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/
requested_gpu_resources contains sprintf("resource claim %v", [claim_name(claim)]) if {
	some claim in spec.resourceClaims
}

default claim_name(_) := "<unnamed>"

claim_name(claim) := claim.name if {
	is_string(claim.name)
	claim.name != ""
}

# A container that asks for a GPU itself: a gated resource, or a DRA claim.
container_requests_gpu(container) if {
	some section in ["requests", "limits"]
	some name, quantity in container.resources[section]
	is_string(name)
	gpu_resource(name)
	not zero_quantity(quantity)
}

container_requests_gpu(container) if count(container.resources.claims) > 0

zero_quantity(quantity) if quantity == 0

zero_quantity(quantity) if {
	is_string(quantity)
	units.parse(quantity) == 0
}

# Messages

default pod_namespace := ""

pod_namespace := ns if {
	ns := pod.metadata.namespace
	is_string(ns)
	ns != ""
} else := ns if {
	ns := request.namespace
	is_string(ns)
	ns != ""
}

default pod_name := "<unnamed>"

pod_name := name if {
	name := pod.metadata.name
	is_string(name)
	name != ""
} else := name if {
	name := pod.metadata.generateName
	is_string(name)
	name != ""
} else := name if {
	name := request.name
	is_string(name)
	name != ""
}

pod_display := concat("/", [pod_namespace, pod_name]) if pod_namespace != ""

else := pod_name

default scheduler_shown := "unset"

scheduler_shown := sprintf(`"%v"`, [spec.schedulerName])

uses_binpack_scheduler if spec.schedulerName == configured_scheduler_name

preset_node_name if {
	is_string(spec.nodeName)
	spec.nodeName != ""
}

# NVIDIA_VISIBLE_DEVICES

# With the NVIDIA container toolkit's default (accept-nvidia-visible-devices-envvar-when-
# unprivileged = true) a container that sets this reaches the GPUs it names, `all` of them,
# whatever it requested; void, none and empty give it none. A value taken from elsewhere
# (valueFrom) is unknown here and counts as naming devices.
# Ref: https://github.com/NVIDIA/nvidia-container-toolkit/blob/main/cmd/nvidia-ctk-installer/toolkit/toolkit.go
visible_devices := "NVIDIA_VISIBLE_DEVICES"

no_device_values := {"", "none", "void"}

# The containers the request brings: every container of a pod being created; the ephemeral
# containers an UPDATE adds (existing ones cannot change; a name the old pod lacks is new).
new_containers contains container if {
	pod_create
	some field in container_fields
	some container in spec[field]
}

new_containers contains container if {
	ephemeral_containers_update
	some container in spec.ephemeralContainers
	not container.name in previous_ephemeral_names
}

previous_ephemeral_names contains container.name if {
	some container in request.oldObject.spec.ephemeralContainers
}

# New containers that set the variable to name devices without requesting a GPU themselves.
unrequested_visible_devices contains container_label(container) if {
	some container in new_containers
	some env in container.env
	env.name == visible_devices
	not no_device(env)
	not container_requests_gpu(container)
}

no_device(env) if {
	not env.valueFrom
	object.get(env, "value", "") in no_device_values
}

default container_label(_) := "<unnamed>"

container_label(container) := container.name if {
	is_string(container.name)
	container.name != ""
}

# Pods that are not judged

exempt if mirror_pod

exempt if operator_pod

# A node's mirror pod of one of its static pods, exactly as NodeRestriction admits a node's
# pod: created by the node (user system:node:<node> in group system:nodes), annotated
# kubernetes.io/config.mirror, bound to that node and owned (controller) by that Node alone,
# as the kubelet writes it. (NodeRestriction also checks the owner's UID against the Node.)
# The static pod runs whatever is decided here; refusing its mirror only hides its GPUs.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/admission/noderestriction/admission.go
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/kubelet/pod/mirror_client.go
node_user_prefix := "system:node:"

mirror_annotation := "kubernetes.io/config.mirror"

requesting_node := name if {
	username := request.userInfo.username
	is_string(username)
	startswith(username, node_user_prefix)
	"system:nodes" in request.userInfo.groups
	name := substring(username, count(node_user_prefix), -1)
	name != ""
}

mirror_pod if {
	node := requesting_node
	is_string(pod.metadata.annotations[mirror_annotation])
	spec.nodeName == node
	count(pod.metadata.ownerReferences) == 1
	some owner in pod.metadata.ownerReferences
	owner.apiVersion == "v1"
	owner.kind == "Node"
	owner.name == node
	owner.controller == true
}

# The GPU Operator's own pods: in its namespace, created by one of its creators (the
# validator's ServiceAccount), or by a DaemonSet controller for a DaemonSet (the operands).
operator_pod if {
	operator := operator_pods
	request.userInfo.username in operator.creators
}

operator_pod if {
	operator := operator_pods
	request.userInfo.username in operator.daemonset_controllers
	owned_by_a_daemonset
}

# The pod's controlling owner is a DaemonSet.
owned_by_a_daemonset if {
	some owner in pod.metadata.ownerReferences
	owner.apiVersion == "apps/v1"
	owner.kind == "DaemonSet"
	owner.controller == true
}

# The operator's pods' description, when valid and the request is in its namespace.
operator_pods := {
	"namespace": config["operator_pods.namespace"],
	"creators": list_items(config["operator_pods.creators"]),
	"daemonset_controllers": list_items(config["operator_pods.daemonset_controllers"]),
} if {
	valid_operator_pods
	request.namespace == config["operator_pods.namespace"]
}

# Pool pods: placed by the binpack scheduler alone, as GPU pods are (two schedulers binding to
# one node each see room the other has just taken, and the kubelet rejects a pod: OutOfcpu).
# Not the DaemonSet controller's pods (one per node, pinned there; the cluster's scheduler
# keeps them), not a toleration of every taint (empty key, Exists: infrastructure).

# The pool's taint, when the data names a valid one.
pool_taint := {
	"key": config["pool_pods.taint.key"],
	"value": config["pool_pods.taint.value"],
	"effect": config["pool_pods.taint.effect"],
} if valid_pool_pods

# A toleration that names the pool taint's key and tolerates it, as the scheduler matches them:
# an empty effect or the taint's, Exists for every value, Equal (or no operator) for the same.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/core/v1/toleration.go
tolerates_pool_taint(toleration) if {
	toleration.key == pool_taint.key
	object.get(toleration, "effect", "") in {"", pool_taint.effect}
	toleration_value_matches(toleration)
}

toleration_value_matches(toleration) if toleration.operator == "Exists"

toleration_value_matches(toleration) if {
	object.get(toleration, "operator", "") in {"", "Equal"}
	object.get(toleration, "value", "") == pool_taint.value
}

pool_daemonset_pod if {
	valid_pool_pods
	request.userInfo.username in list_items(config["pool_pods.daemonset_controllers"])
	owned_by_a_daemonset
}

# In one of the pool's namespaces: elsewhere a pod that asks for no GPU has no place on the
# pool (the pool deny rules below).
pool_pod if {
	pod_create
	not preset_node_name
	some toleration in spec.tolerations
	tolerates_pool_taint(toleration)
	request.namespace in pool_namespaces
	not pool_daemonset_pod
}

# The GPU pool's nodes, and where pods that ask for no GPU may run on them.
pool_nodes := list_items(object.get(config, "pool_nodes", ""))

pool_namespaces := list_items(object.get(config, "pool_namespaces", ""))

pool_daemonsets := list_items(object.get(config, "pool_daemonsets", ""))

# The tolerations the request brings: a new pod's, or those an UPDATE adds.
new_tolerations contains toleration if {
	pod_create
	some toleration in spec.tolerations
}

new_tolerations contains toleration if {
	pod_update
	some toleration in spec.tolerations
	not toleration in previous_tolerations
}

previous_tolerations contains toleration if {
	some toleration in request.oldObject.spec.tolerations
}

# One of them tolerates the pool's taint, naming its key or every key.
covers_pool_taint if {
	some toleration in new_tolerations
	covers_pool(toleration)
}

covers_pool(toleration) if tolerates_pool_taint(toleration)

covers_pool(toleration) if {
	object.get(toleration, "key", "") == ""
	toleration.operator == "Exists"
	object.get(toleration, "effect", "") in {"", pool_taint.effect}
}

# The pool's node a pod being created is bound to (the kubelet checks only NoExecute taints).
pool_node_name := spec.nodeName if {
	pod_create
	preset_node_name
	spec.nodeName in pool_nodes
}

pool_allowed if request.namespace in pool_namespaces

pool_allowed if {
	valid_pool_pods
	request.userInfo.username in list_items(config["pool_pods.daemonset_controllers"])
	some owner in pod.metadata.ownerReferences
	owner.apiVersion == "apps/v1"
	owner.kind == "DaemonSet"
	owner.controller == true
	concat("/", [request.namespace, owner.name]) in pool_daemonsets
}

pool_allowed_shown := concat("", [
	allowed_namespaces_shown,
	allowed_daemonsets_shown,
])

default allowed_namespaces_shown := ""

allowed_namespaces_shown := sprintf(", and pods in namespaces: %s", [concat(", ", pool_namespaces)]) if {
	count(pool_namespaces) > 0
}

default allowed_daemonsets_shown := ""

allowed_daemonsets_shown := sprintf(", and pods of DaemonSets: %s", [concat(", ", pool_daemonsets)]) if {
	count(pool_daemonsets) > 0
}

# A pod that asks for no GPU, outside pool_allowed, that the rules below judge.
pool_outsider if {
	not exempt
	count(config_errors) == 0
	valid_pool_pods
	count(requested_gpu_resources) == 0
	not pool_allowed
}

default tolerates_verb := "is updated to tolerate"

tolerates_verb := "tolerates" if pod_create

# A pod being created, not bound to a node, of a PodGroup, when the gate keeps gangs on the
# binpack scheduler, in one of gang_namespaces (absent or empty: every namespace).
gang_pod if {
	pod_create
	config.gang_pods == "true"
	gang_namespace
	not preset_node_name
	non_empty_string(spec.schedulingGroup.podGroupName)
}

gang_namespaces := list_items(object.get(config, "gang_namespaces", ""))

default gang_namespace := false

gang_namespace if count(gang_namespaces) == 0

gang_namespace if request.namespace in gang_namespaces

# The stack's PriorityClasses (priority_classes; absent or empty: none, the rule is off) may
# preempt other pods: a pod being created may name one only when it asks for a GPU, or when its
# namespace is one of priority_class_namespaces. The Priority admission plugin refuses a
# spec.priority that its class does not give, so the class name is all there is to judge; it
# cannot change after creation.
# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/
stack_priority_classes := list_items(config.priority_classes)

priority_class_namespaces := list_items(config.priority_class_namespaces)

stack_priority_class := name if {
	pod_create
	name := spec.priorityClassName
	is_string(name)
	name in stack_priority_classes
}

priority_class_namespace if request.namespace in priority_class_namespaces

default priority_classes_allowed := " only"

priority_classes_allowed := sprintf(" and pods in namespaces: %s", [concat(", ", priority_class_namespaces)]) if {
	count(priority_class_namespaces) > 0
}

# Decisions

deny contains msg if {
	pod_create
	not spec_is_object
	msg := sprintf(`pod "%s" cannot be evaluated: request.object.spec is missing or not an object`, [pod_display])
}

deny contains msg if {
	pod_create
	not exempt
	count(config_errors) == 0
	some resource in requested_gpu_resources
	not uses_binpack_scheduler
	msg := sprintf(
		`pod "%s" requests %s but spec.schedulerName is %s; GPU pods must set spec.schedulerName: %s`,
		[pod_display, resource, scheduler_shown, configured_scheduler_name],
	)
}

deny contains msg if {
	pod_create
	not exempt
	count(config_errors) == 0
	some resource in requested_gpu_resources
	uses_binpack_scheduler
	preset_node_name
	msg := sprintf(
		`pod "%s" requests %s but sets spec.nodeName, which skips the scheduler; GPU pods are placed by %s`,
		[pod_display, resource, configured_scheduler_name],
	)
}

# A pool pod that asks for a GPU is judged as a GPU pod only.
deny contains msg if {
	pod_create
	not exempt
	count(config_errors) == 0
	count(requested_gpu_resources) == 0
	pool_pod
	not uses_binpack_scheduler
	msg := sprintf(
		`pod "%s" tolerates the GPU pool's taint %s but spec.schedulerName is %s; pods that tolerate it must set spec.schedulerName: %s (one scheduler places every pod on the pool's nodes)`,
		[pod_display, pool_taint.key, scheduler_shown, configured_scheduler_name],
	)
}

# A pod that asks for no GPU on the pool's nodes: bound to one of them when created ...
deny contains msg if {
	pool_outsider
	node := pool_node_name
	msg := sprintf(
		`pod "%s" asks for no GPU but spec.nodeName is %s, a node of the GPU pool; the pool's nodes take GPU pods%s`,
		[pod_display, node, pool_allowed_shown],
	)
}

# ... or tolerating the pool's taint, bound to no node.
deny contains msg if {
	pool_outsider
	not preset_node_name
	covers_pool_taint
	msg := sprintf(
		`pod "%s" asks for no GPU but %s the GPU pool's taint %s; the pool's nodes take GPU pods%s`,
		[pod_display, tolerates_verb, pool_taint.key, pool_allowed_shown],
	)
}

# A gang member that asks for no GPU and tolerates no pool taint (those are judged above).
deny contains msg if {
	pod_create
	not exempt
	count(config_errors) == 0
	count(requested_gpu_resources) == 0
	not pool_pod
	gang_pod
	not uses_binpack_scheduler
	msg := sprintf(
		`pod "%s" is a member of PodGroup %s but spec.schedulerName is %s; pods of a PodGroup must set spec.schedulerName: %s (a gang on two schedulers never starts whole)`,
		[pod_display, spec.schedulingGroup.podGroupName, scheduler_shown, configured_scheduler_name],
	)
}

deny contains msg if {
	pod_create
	not exempt
	count(config_errors) > 0
	some resource in requested_gpu_resources
	msg := sprintf(
		`pod "%s" requests %s but the GPU scheduler gate is not configured (%s); GPU pods are refused until it is`,
		[pod_display, resource, concat("; ", config_errors)],
	)
}

# A pod that asks for no GPU and names one of the stack's PriorityClasses, outside the
# namespaces that may use them.
deny contains msg if {
	not exempt
	count(config_errors) == 0
	count(requested_gpu_resources) == 0
	class := stack_priority_class
	not priority_class_namespace
	msg := sprintf(
		`pod "%s" sets spec.priorityClassName: %s but requests no GPU; the stack's PriorityClasses (%s) are for GPU pods%s`,
		[pod_display, class, concat(", ", stack_priority_classes), priority_classes_allowed],
	)
}

deny contains msg if {
	not exempt
	some container in unrequested_visible_devices
	msg := sprintf(
		`pod "%s" sets NVIDIA_VISIBLE_DEVICES in container "%s" without requesting a GPU; a container that requests none may only set it to void or none`,
		[pod_display, container],
	)
}
