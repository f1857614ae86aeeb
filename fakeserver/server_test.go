package fakeserver_test

import (
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

// postPayment sends one payment with key through hc and returns the
// answer's status and its Idempotent-Replayed header field.
func postPayment(t *testing.T, hc *http.Client, base, key string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/payments",
		strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), nil
}

func TestTLSServer(t *testing.T) {
	t.Parallel()
	t.Run("its client pays over HTTPS and the retry replays", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewTLSServer(nil)
		t.Cleanup(srv.Close)
		require.True(t, strings.HasPrefix(srv.URL, "https://127.0.0.1:"), srv.URL)
		for _, replayed := range []string{"", "true"} {
			status, got, err := postPayment(t, srv.Client(), srv.URL, "k1")
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, status)
			assert.Equal(t, replayed, got)
		}
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
	t.Run("a client that does not trust its certificate is refused and nothing is charged", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewTLSServer(nil)
		t.Cleanup(srv.Close)
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		_, _, err := postPayment(t, &http.Client{Transport: tr}, srv.URL, "k1")
		var unknown x509.UnknownAuthorityError
		require.ErrorAs(t, err, &unknown)
		assert.Zero(t, srv.Stats().Requests)
	})
	t.Run("its certificate is the one its client trusts, and a plain server has none", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewTLSServer(nil)
		t.Cleanup(srv.Close)
		cert := srv.Certificate()
		require.NotNil(t, cert)
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		_, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"})
		require.NoError(t, err)

		plain := fakeserver.NewServer(nil)
		t.Cleanup(plain.Close)
		assert.Nil(t, plain.Certificate())
		assert.True(t, strings.HasPrefix(plain.URL, "http://"), plain.URL)
	})
	t.Run("a lost answer over HTTPS is a lost answer, and its retry replays", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewTLSServer(nil)
		t.Cleanup(srv.Close)
		for _, kind := range []fakeserver.FaultKind{fakeserver.FaultDropResponse, fakeserver.FaultReset} {
			require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: kind, Key: "k-" + string(kind)}))
			// A fresh connection each time: net/http retries a keyed POST
			// on a reused one by itself (see the package docs).
			tr := srv.Client().Transport.(*http.Transport).Clone()
			_, _, err := postPayment(t, &http.Client{Transport: tr}, srv.URL, "k-"+string(kind))
			require.Error(t, err, string(kind))
			var unknown x509.UnknownAuthorityError
			assert.False(t, errors.As(err, &unknown), "the handshake succeeded: %v", err)
			tr.CloseIdleConnections()
		}
		status, replayed, err := postPayment(t, srv.Client(), srv.URL, "k-"+string(fakeserver.FaultDropResponse))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, status)
		assert.Equal(t, "true", replayed)
		assert.Equal(t, 1, srv.Stats().ProviderCharges, "the reset request never reached the work")
	})
}
