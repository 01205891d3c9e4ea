// Pins the Pulumi Python SDK's helper scripts installed by tools/build-pulumi.sh,
// at the release of the pulumi PyPI package in requirements.txt:
//
//   python/cmd/pulumi-language-python-exec    run by the language host
//   python/dist/pulumi-resource-pulumi-python launcher of Python dynamic providers
//
// They ship in the github.com/pulumi/pulumi/sdk/v3 module zip. The language host
// itself (module github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3,
// untagged) is refused by the module proxy at every version and commit, so it is
// not built here (see tools/README.md).
module gpu-cluster/tools/pulumi-python

go 1.25.0

require github.com/pulumi/pulumi/sdk/v3 v3.272.0
