//go:build tools

// Package depspin keeps the module's chosen dependencies in go.mod while the
// packages that use them are written.
package depspin

import (
	_ "github.com/cenkalti/backoff/v4"
	_ "github.com/dunglas/httpsfv"
	_ "github.com/gofrs/flock"
	_ "github.com/google/uuid"
	_ "github.com/hashicorp/go-retryablehttp"
	_ "github.com/stretchr/testify/assert"
	_ "github.com/stretchr/testify/require"
	_ "go.etcd.io/bbolt"
	_ "go.uber.org/goleak"
)
