package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assert.Contains(t, out.String(), "A was never sent, so it was replaced (A deleted: true); the answer is lost, outcome unknown: true")
	assert.Contains(t, out.String(), "refused, intent B")
	assert.Contains(t, out.String(), "settled B: succeeded")
	assert.Contains(t, out.String(), "server: 2 payments, 2 provider charges")
}
