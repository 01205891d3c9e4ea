// Command kube-scheduler (built here as gpu-binpack-scheduler) is kube-scheduler with the
// GpuFragmentation and GpuClaimBinpack score plugins registered, out of tree, as
// kubernetes-sigs/scheduler-plugins builds its scheduler. It keeps upstream's command name, so
// an image built with ko
// (/ko-app/kube-scheduler, on PATH) runs with the same Deployment command as
// registry.k8s.io/kube-scheduler. Every upstream flag and plugin works as in kube-scheduler; a
// profile enables GpuFragmentation (scoring fragmentation) or GpuClaimBinpack (scoring binpack
// with DRA GPUs) in its configuration.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // the JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // the version metric, as upstream
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"gpu-cluster/scheduler/fragmentation"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(fragmentation.Name, fragmentation.New),
		app.WithPlugin(fragmentation.ClaimBinpackName, fragmentation.NewClaimBinpack),
	)
	os.Exit(cli.Run(command))
}
