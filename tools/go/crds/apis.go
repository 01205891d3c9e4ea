// Package crds only pins the API packages controller-gen reads (see go.mod).
package crds

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)
