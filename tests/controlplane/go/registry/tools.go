//go:build tools

// Package tools pins the registry command so `go mod tidy` keeps its dependencies.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
