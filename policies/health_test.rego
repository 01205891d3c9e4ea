package system.health

test_ready_with_policy_and_config if {
	ready with data.gpu_cluster.config as {"scheduler_name": "gpu-binpack-scheduler"}
}

test_not_ready_without_config if {
	not ready with data.gpu_cluster.config as "missing"
}

test_live_always if {
	live
}
