package system.health

gate_config := {"scheduler_name": "gpu-binpack-scheduler"}

test_ready_with_policy_and_config if {
	ready with data.gpu_cluster.config as gate_config
}

test_not_ready_without_config if {
	not ready
}

test_not_ready_with_invalid_config if {
	not ready with data.gpu_cluster.config as {"scheduler_name": ""}
}

test_not_ready_without_admission_decision if {
	not ready with data.gpu_cluster.config as gate_config
		with data.system.main as "missing"
}

test_live_always if {
	live
}
