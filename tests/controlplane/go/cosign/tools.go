//go:build tools

// Package tools pins the cosign command so `go mod tidy` keeps its dependencies.
package tools

import _ "github.com/sigstore/cosign/v2/cmd/cosign"
