"""What the tests, the benchmarks and the demo share: an emulated Kubernetes API with the CRD's
validation, and helpers for real processes on loopback. Never imported by the two shipped
packages (an import contract checks it)."""
