"""GpuPriorityClasses: the PriorityClasses GPU workloads are given (settings, manifests,
component)."""
