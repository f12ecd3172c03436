// Command pulumi-resource-kubernetes is the pulumi-kubernetes provider plugin, built from its module (see
// scripts/build-k8s): the module's own cmd/pulumi-resource-kubernetes/main.go, whose embedded schema and
// Terraform mapping `go generate` makes in the provider's repository; scripts/build-k8s writes them here from the
// module's schema.json and terraform-mapping.json the same way (the version set, compacted).
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var pulumiSchema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}
