//go:build tools

// Package tools keeps the etcd server command in this module's build list.
package tools

import _ "go.etcd.io/etcd/server/v3"
