package system.authz

test_allow_default_decision if {
	allow with input as {"method": "POST", "path": [""]}
}

test_allow_health if {
	allow with input as {"method": "GET", "path": ["health"]}
}

test_allow_health_ready if {
	allow with input as {"method": "GET", "path": ["health", "ready"]}
}

test_deny_get_of_default_decision if {
	not allow with input as {"method": "GET", "path": [""]}
}

test_deny_policy_upload if {
	not allow with input as {"method": "PUT", "path": ["v1", "policies", "x"]}
}

test_deny_policy_delete if {
	not allow with input as {"method": "DELETE", "path": ["v1", "policies", "x"]}
}

test_deny_data_write if {
	not allow with input as {"method": "PUT", "path": ["v1", "data", "gpu_cluster", "config"]}
}

test_deny_data_read if {
	not allow with input as {"method": "GET", "path": ["v1", "data", "gpu_cluster", "config"]}
}

test_deny_post_to_data_api if {
	not allow with input as {"method": "POST", "path": ["v1", "data"]}
}

test_deny_post_to_health if {
	not allow with input as {"method": "POST", "path": ["health"]}
}
