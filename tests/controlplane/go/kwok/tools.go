//go:build tools

// Package tools keeps the kwok command in this module's build list.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
