package fragmentation

import (
	"fmt"
	"math"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Args are the plugin's arguments (pluginConfig[].args); every field is optional.
type Args struct {
	// GPUResources are the extended resources counted as whole GPUs, one GPU per item, each its
	// own kind (default nvidia.com/gpu). A name also in SharedResources, or under
	// MIGResourcePrefix, is counted as that instead.
	GPUResources []string `json:"gpuResources,omitempty"`
	// SharedResources are resources whose items are replicas of a GPU (time-slicing or MPS):
	// each counts 1/replicas of a GPU (none by default).
	SharedResources []SharedResource `json:"sharedResources,omitempty"`
	// MIGResourcePrefix: resources named <prefix><profile> are MIG devices (mig.strategy
	// mixed), each counted as its profile's slices of one GPU (default nvidia.com/mig-; ""
	// counts none).
	MIGResourcePrefix *string `json:"migResourcePrefix,omitempty"`
	// MIGSlices is how many slices a whole GPU has in MIG profile names (default 7: A100,
	// H100, H200, B200; 4 on A30).
	MIGSlices *int `json:"migSlices,omitempty"`
	// MaxClasses is how many of the most frequent learned pod shapes the model keeps (default 64).
	MaxClasses *int `json:"maxClasses,omitempty"`
	// MaxPriorClasses is how many whole-node prior classes the model keeps, those of the most
	// nodes (default 16).
	MaxPriorClasses *int `json:"maxPriorClasses,omitempty"`
	// PriorWeight is the weight of each whole-node prior class (default 0.003; 0 turns them off).
	PriorWeight *float64 `json:"priorWeight,omitempty"`
	// Window is the number of GPU pods after which the learned counts are halved (default 10000).
	Window *int `json:"window,omitempty"`
}

// SharedResource is a resource whose items are replicas of a GPU.
type SharedResource struct {
	// Name of the resource, e.g. nvidia.com/gpu.shared.
	Name string `json:"name"`
	// Replicas is how many items each GPU is advertised as (the device plugin's
	// sharing.timeSlicing.resources[].replicas).
	Replicas int `json:"replicas"`
}

// Defaults of Args, and the bounds ParseArgs checks.
const (
	DefaultGPUResource       = "nvidia.com/gpu"
	DefaultMIGResourcePrefix = "nvidia.com/mig-"
	DefaultMIGSlices         = 7
	DefaultMaxClasses        = 64
	DefaultMaxPriorClasses   = 16
	DefaultPriorWeight       = 0.003
	DefaultWindow            = 10000

	maxReplicas = 1024
	maxUnit     = 1 << 20
)

type sharedResource struct {
	name     v1.ResourceName
	replicas int64
}

type config struct {
	gpuResources    []v1.ResourceName
	shared          []sharedResource
	migPrefix       string
	migSlices       int64
	unit            int64 // GPU units per whole GPU
	maxClasses      int
	maxPriorClasses int
	priorWeight     float64
	window          int
}

// ParseArgs applies the defaults and checks the values; an error names the field, the value
// and what is allowed.
func ParseArgs(args Args) (config, error) {
	c := config{
		migPrefix: DefaultMIGResourcePrefix, migSlices: DefaultMIGSlices, maxClasses: DefaultMaxClasses,
		maxPriorClasses: DefaultMaxPriorClasses, priorWeight: DefaultPriorWeight, window: DefaultWindow,
	}
	if args.MIGResourcePrefix != nil {
		p := *args.MIGResourcePrefix
		if p != "" && (!strings.Contains(p, "/") || strings.HasSuffix(p, "/")) {
			return c, fmt.Errorf("%s args: migResourcePrefix is %q; expected a resource name prefix with its domain such as %s, or \"\" to count no MIG devices", Name, p, DefaultMIGResourcePrefix)
		}
		c.migPrefix = p
	}
	if args.MIGSlices != nil {
		if *args.MIGSlices < 1 || *args.MIGSlices > 8 {
			return c, fmt.Errorf("%s args: migSlices is %d; expected 1 to 8 (7 on A100, H100, H200 and B200; 4 on A30)", Name, *args.MIGSlices)
		}
		c.migSlices = int64(*args.MIGSlices)
	}
	c.unit = 1
	if c.migPrefix != "" {
		c.unit = c.migSlices
	}
	named := map[v1.ResourceName]string{}
	for i, s := range args.SharedResources {
		field := fmt.Sprintf("sharedResources[%d]", i)
		if !extendedName(s.Name) {
			return c, fmt.Errorf("%s args: %s.name is %q; expected an extended resource name such as nvidia.com/gpu.shared", Name, field, s.Name)
		}
		if c.migPrefix != "" && strings.HasPrefix(s.Name, c.migPrefix) {
			return c, fmt.Errorf("%s args: %s.name is %q, under migResourcePrefix %q; a MIG device is a slice, not a replica", Name, field, s.Name, c.migPrefix)
		}
		if prev, ok := named[v1.ResourceName(s.Name)]; ok {
			return c, fmt.Errorf("%s args: %s.name is %q, as is %s.name; expected each resource once", Name, field, s.Name, prev)
		}
		if s.Replicas < 1 || s.Replicas > maxReplicas {
			return c, fmt.Errorf("%s args: %s.replicas is %d; expected 1 to %d items per GPU", Name, field, s.Replicas, maxReplicas)
		}
		named[v1.ResourceName(s.Name)] = field
		c.shared = append(c.shared, sharedResource{name: v1.ResourceName(s.Name), replicas: int64(s.Replicas)})
		if c.unit = lcm(c.unit, int64(s.Replicas)); c.unit > maxUnit {
			return c, fmt.Errorf("%s args: %s.replicas is %d, which with the other replicas and migSlices makes a GPU %d units; expected at most %d (fewer distinct replica counts)", Name, field, s.Replicas, c.unit, maxUnit)
		}
	}
	names := args.GPUResources
	if len(names) == 0 {
		names = []string{DefaultGPUResource}
	}
	for _, n := range names {
		if !extendedName(n) {
			return c, fmt.Errorf("%s args: gpuResources contains %q; expected extended resource names such as %s", Name, n, DefaultGPUResource)
		}
		if _, dup := named[v1.ResourceName(n)]; dup || (c.migPrefix != "" && strings.HasPrefix(n, c.migPrefix)) {
			continue // counted as shared replicas or MIG slices
		}
		named[v1.ResourceName(n)] = "gpuResources"
		c.gpuResources = append(c.gpuResources, v1.ResourceName(n))
	}
	if n := len(c.gpuResources) + len(c.shared); n > MaxKinds {
		return c, fmt.Errorf("%s args: gpuResources and sharedResources name %d resources; expected at most %d", Name, n, MaxKinds)
	}
	if args.MaxClasses != nil {
		if *args.MaxClasses < 1 || *args.MaxClasses > 1024 {
			return c, fmt.Errorf("%s args: maxClasses is %d; expected 1 to 1024", Name, *args.MaxClasses)
		}
		c.maxClasses = *args.MaxClasses
	}
	if args.MaxPriorClasses != nil {
		if *args.MaxPriorClasses < 1 || *args.MaxPriorClasses > 256 {
			return c, fmt.Errorf("%s args: maxPriorClasses is %d; expected 1 to 256 (priorWeight 0 turns priors off)", Name, *args.MaxPriorClasses)
		}
		c.maxPriorClasses = *args.MaxPriorClasses
	}
	if args.PriorWeight != nil {
		w := *args.PriorWeight
		if math.IsNaN(w) || w < 0 || w > 1 {
			return c, fmt.Errorf("%s args: priorWeight is %v; expected 0 (no priors) to 1", Name, w)
		}
		c.priorWeight = w
	}
	if args.Window != nil {
		if *args.Window < 2 {
			return c, fmt.Errorf("%s args: window is %d; expected at least 2 pods", Name, *args.Window)
		}
		c.window = *args.Window
	}
	return c, nil
}

func extendedName(n string) bool {
	return n != "" && n != string(v1.ResourceCPU) && n != string(v1.ResourceMemory)
}
