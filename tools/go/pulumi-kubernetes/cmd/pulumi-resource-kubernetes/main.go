// Command pulumi-resource-kubernetes serves the Kubernetes resource provider.
//
// schema.json and terraform-mapping.json are copied here from the provider module's zip by
// tools/build-pulumi.sh before the build (git-ignored), with the schema's version set to the
// release the module's commit belongs to.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema.json
var schema []byte

//go:embed terraform-mapping.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, schema, terraformMapping)
}
