package fragmentation

import (
	"context"
	"fmt"
	"math"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// GpuClaimBinpack packs pods that ask for GPUs through ResourceClaims, which kube-scheduler
// v1.37.2's own score plugins place on cpu and memory alone: NodeResourcesFit and
// BalancedAllocation see extended resources only (a DRA-backed one included), and
// DynamicResources scores only the choice among a claim's prioritized alternatives.
//
// It scores a claim pod's node as RequestedToCapacityRatio scores an extended resource, with the
// same utilization -> score shape: per kind of device the pod's claims ask for, (devices held by
// claims + the pod's) / the node's devices of that kind, through the shape; the kinds' scores
// averaged (those scoring 0 left out, as upstream leaves them out). The devices are dra.go's:
// the driver's ResourceSlices, what the DRA manager's claim tracker holds (allocations in flight
// included), read again only for the nodes an event named; a pod's demand is dra.go's too.
//
// Kinds: a whole GPU (type gpu) is one kind; each MIG profile is a kind of its own (type mig,
// profile 1g.10gb, 3g.40gb...), so a 1g.10gb pod is scored by how full the node's 1g.10gb devices
// would be, as RequestedToCapacityRatio scores nvidia.com/mig-1g.10gb under the device plugin's
// mixed strategy: MIG devices are partitions fixed by the node's MIG layout, a pod of one
// profile fits only devices of that profile, and they never count against whole GPUs.
//
// Pods without ResourceClaims, or whose claims ask for no GPU of the driver, are not scored
// (PreScore skips them): NodeResourcesFit scores them, extended resources mapped to DRA
// included.
// Ref: k8s.io/kubernetes@v1.37.2 pkg/scheduler/framework/plugins/noderesources/requested_to_capacity_ratio.go
const ClaimBinpackName = "GpuClaimBinpack"

const claimStateKey fwk.StateKey = ClaimBinpackName

// ClaimBinpackArgs are GpuClaimBinpack's arguments (pluginConfig[].args).
type ClaimBinpackArgs struct {
	// Shape maps a kind's utilization after the pod (0-100) to a score (0-10), as
	// NodeResourcesFit's requestedToCapacityRatio.shape does (default: 0 -> 0, 100 -> 10).
	Shape []ShapePoint `json:"shape,omitempty"`
}

// ShapePoint is one point of the utilization -> score curve.
type ShapePoint struct {
	Utilization int32 `json:"utilization"`
	Score       int32 `json:"score"`
}

// maxShapeScore is RequestedToCapacityRatio's highest shape score (config.MaxCustomPriorityScore).
const maxShapeScore = 10

// ClaimBinpack is the GpuClaimBinpack plugin.
type ClaimBinpack struct {
	*draTracker
	score func(utilization int64) int64 // 0..100 -> 0..MaxNodeScore
}

var (
	_ fwk.PreScorePlugin = &ClaimBinpack{}
	_ fwk.ScorePlugin    = &ClaimBinpack{}
	_ fwk.ReservePlugin  = &ClaimBinpack{}
	_ fwk.SignPlugin     = &ClaimBinpack{}
)

// NewClaimBinpack is the plugin factory registered with the scheduler command.
func NewClaimBinpack(_ context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	var args ClaimBinpackArgs
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return nil, fmt.Errorf("%s args: %w", ClaimBinpackName, err)
		}
	}
	score, err := parseShape(args.Shape)
	if err != nil {
		return nil, err
	}
	// The default kinds: a DRA GPU is a GPU of nvidia.com/gpu, a MIG device one of
	// nvidia.com/mig-<profile>. The names only key the kinds here; ratios need no units.
	c, err := ParseArgs(Args{})
	if err != nil {
		return nil, err
	}
	p := &ClaimBinpack{draTracker: newDRATracker(handle, c, newResources(c)), score: score}
	if handle != nil {
		if f := handle.SharedInformerFactory(); f != nil {
			if err := p.watchDRA(f); err != nil {
				return nil, fmt.Errorf("%s: watching ResourceSlices and ResourceClaims: %w", ClaimBinpackName, err)
			}
		}
	}
	return p, nil
}

// parseShape checks the shape as kube-scheduler checks requestedToCapacityRatio.shape and
// returns the scoring function RequestedToCapacityRatio builds from it.
func parseShape(shape []ShapePoint) (func(int64) int64, error) {
	if len(shape) == 0 {
		shape = []ShapePoint{{Utilization: 0, Score: 0}, {Utilization: 100, Score: maxShapeScore}}
	}
	points := make(helper.FunctionShape, 0, len(shape))
	for i, s := range shape {
		if s.Utilization < 0 || s.Utilization > 100 {
			return nil, fmt.Errorf("%s args: shape[%d].utilization is %d; expected 0 to 100", ClaimBinpackName, i, s.Utilization)
		}
		if i > 0 && s.Utilization <= shape[i-1].Utilization {
			return nil, fmt.Errorf("%s args: shape[%d].utilization is %d; expected more than shape[%d].utilization, %d (utilizations strictly increase)", ClaimBinpackName, i, s.Utilization, i-1, shape[i-1].Utilization)
		}
		if s.Score < 0 || s.Score > maxShapeScore {
			return nil, fmt.Errorf("%s args: shape[%d].score is %d; expected 0 to %d", ClaimBinpackName, i, s.Score, maxShapeScore)
		}
		points = append(points, helper.FunctionShapePoint{
			Utilization: int64(s.Utilization),
			Score:       int64(s.Score) * (fwk.MaxNodeScore / maxShapeScore),
		})
	}
	return helper.BuildBrokenLinearFunction(points), nil
}

// Name of the plugin.
func (p *ClaimBinpack) Name() string { return ClaimBinpackName }

type claimState struct {
	demand Room // GPU units per kind the pod's claims ask for
}

func (s *claimState) Clone() fwk.StateData { return s }

// PreScore reads again the DRA room of the nodes events named and the pod's claim demand; a pod
// whose claims ask for no GPU is skipped.
func (p *ClaimBinpack) PreScore(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if len(pod.Spec.ResourceClaims) == 0 {
		return fwk.NewStatus(fwk.Skip)
	}
	p.refreshDRA() // before the demand: allocationMode All counts the largest node's GPUs
	demand := p.claimDemand(pod)
	if demand.TotalGPUs() == 0 {
		return fwk.NewStatus(fwk.Skip)
	}
	state.Write(claimStateKey, &claimState{demand: demand})
	return nil
}

// Score is RequestedToCapacityRatio over the node's DRA devices of the kinds the pod asks for.
func (p *ClaimBinpack) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, node fwk.NodeInfo) (int64, *fwk.Status) {
	data, err := state.Read(claimStateKey)
	if err != nil {
		return 0, fwk.AsStatus(fmt.Errorf("reading %q from the cycle state: %w", claimStateKey, err))
	}
	s, ok := data.(*claimState)
	if !ok {
		return 0, fwk.AsStatus(fmt.Errorf("%q in the cycle state is a %T", claimStateKey, data))
	}
	n := node.Node()
	if n == nil {
		return 0, nil
	}
	return p.nodeScore(p.draRoomOf(n.Name), s.demand), nil
}

// nodeScore is RequestedToCapacityRatio's node score with every kind weighted alike: a kind the
// node has none of is left out, a kind over capacity scores as full, a kind scoring 0 is left
// out of the average.
func (p *ClaimBinpack) nodeScore(room draRoom, demand Room) int64 {
	var sum, kinds int64
	for k, want := range demand.GPUs {
		capacity := room.alloc.GPUs[k]
		if want == 0 || capacity == 0 {
			continue
		}
		requested := capacity - room.free.GPUs[k] + want
		utilization := int64(100)
		if requested <= capacity {
			utilization = requested * 100 / capacity
		}
		if score := p.score(utilization); score > 0 {
			sum += score
			kinds++
		}
	}
	if kinds == 0 {
		return 0
	}
	return int64(math.Round(float64(sum) / float64(kinds)))
}

// ScoreExtensions: none, scores are 0..MaxNodeScore already.
func (p *ClaimBinpack) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve: DynamicResources' Reserve holds the pod's devices in the claim tracker; the next
// cycle reads the node again.
func (p *ClaimBinpack) Reserve(_ context.Context, _ fwk.CycleState, _ *v1.Pod, nodeName string) *fwk.Status {
	p.dra.mark(nodeName)
	return nil
}

// Unreserve: the devices were released; the next cycle reads the node again.
func (p *ClaimBinpack) Unreserve(_ context.Context, _ fwk.CycleState, _ *v1.Pod, nodeName string) {
	p.dra.mark(nodeName)
}

// SignPod: a pod without claims is not scored, so it signs with nothing; a claim pod is not
// signable, as DynamicResources refuses it (its score depends on the devices left, node by
// node).
func (p *ClaimBinpack) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) > 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with ResourceClaims are not signable")
	}
	return nil, nil
}
