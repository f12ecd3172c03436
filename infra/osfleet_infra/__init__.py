"""osfleet's Pulumi program: components (KvmHost, GoldenImage, HostAgent), their dynamic providers, and the
stacks (lab, onprem, aws, k8s). Importable without side effects so tests can set mocks first."""
