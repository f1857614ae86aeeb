package idem_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

func TestAnIntentThatCouldNeverBeSentIsRefusedAtCreation(t *testing.T) {
	t.Parallel()
	store := persist.NewMemory(nil)
	c, err := idem.New(idem.WithStore(store))
	require.NoError(t, err)
	for _, u := range []string{
		"ftp://pay.example.com/payments",
		"file:///payments",
		"https://:443/payments",
		"https://pay.example.com:99999/payments",
		"https://pay.example.com:0/payments",
	} {
		_, err := c.Intent(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: u})
		assert.Error(t, err, "%s", u)
	}
	recs, err := store.List(context.Background(), persist.Filter{})
	require.NoError(t, err)
	assert.Empty(t, recs, "nothing was created")
}
