package system.authz

token := "0123456789abcdef0123456789abcdef0123456789abcdef"

request(method, path, identity) := {"method": method, "path": path, "identity": identity}

test_allow_anonymous_default_decision if {
	allow with input as {"method": "POST", "path": [""]}
}

test_allow_anonymous_health if {
	allow with input as {"method": "GET", "path": ["health", "ready"]}
}

test_deny_anonymous_policy_upload if {
	not allow with input as {"method": "PUT", "path": ["v1", "policies", "x"]}
}

test_deny_anonymous_data_read if {
	not allow with input as {"method": "GET", "path": ["v1", "data", "gpu_cluster", "mgmt"]}
}

test_deny_anonymous_post_to_data_api if {
	not allow with input as {"method": "POST", "path": ["v1", "data"]}
}

test_allow_management_with_token if {
	allow with input as request("PUT", ["v1", "policies", "x"], token)
		with data.gpu_cluster.mgmt.token as token
}

test_deny_management_with_wrong_token if {
	not allow with input as request("PUT", ["v1", "policies", "x"], "nope")
		with data.gpu_cluster.mgmt.token as token
}

test_deny_empty_identity_when_token_missing if {
	not allow with input as request("PUT", ["v1", "policies", "x"], "")
		with data.gpu_cluster.mgmt as {}
}

test_deny_short_token if {
	not allow with input as request("PUT", ["v1", "policies", "x"], "short")
		with data.gpu_cluster.mgmt.token as "short"
}
