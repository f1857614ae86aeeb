package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)

// readCert reads the PEM certificate a device is given.
func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	block, rest := pem.Decode(data)
	require.NotNil(t, block, "no PEM block in %s", file)
	require.Equal(t, "CERTIFICATE", block.Type)
	require.Empty(t, strings.TrimSpace(string(rest)), "one certificate only")
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return cert
}

// trusting returns a client that trusts cert alone, as a device told to.
func trusting(t *testing.T, cert *x509.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestProgramTLS checks the program serving TLS, and its TLS flags.
func TestProgramTLS(t *testing.T) {
	t.Parallel()
	t.Run("a client that trusts the written certificate pays over HTTPS, and its retry replays", func(t *testing.T) {
		t.Parallel()
		certFile := filepath.Join(t.TempDir(), "fakeserver.pem")
		addr, _, lines := startProgram(t, buildProgram(t), "-tls", certFile)
		require.True(t, lines.Scan())
		assert.Contains(t, lines.Text(), "msg=\"tls certificate\"")
		assert.Contains(t, lines.Text(), "sha256=")
		go func() {
			for lines.Scan() {
			}
		}()
		cert := readCert(t, certFile)

		// By name, as an iOS simulator or a device after adb reverse
		// reaches the host.
		base := "https://" + strings.Replace(addr, "127.0.0.1", "localhost", 1)
		client := trusting(t, cert)
		for _, replayed := range []string{"", "true"} {
			req, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "k1")
			resp, err := client.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, replayed, resp.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, "HTTP/1.1", resp.Proto)
		}

		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		_, err := (&http.Client{Transport: tr}).Get(base + "/_fake/stats")
		var unknown x509.UnknownAuthorityError
		require.ErrorAs(t, err, &unknown, "a client that was not told to trust it")
		// Cleartext on the TLS port gets net/http's 400, which says why.
		resp, err := client.Get("http://" + addr + "/_fake/stats")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(body), "HTTPS")
	})
	t.Run("with a certificate the server speaks HTTPS only, in HTTP/1.1", func(t *testing.T) {
		t.Parallel()
		cert, _, err := serverCert(filepath.Join(t.TempDir(), "c.pem"), "", []string{"127.0.0.1"}, time.Now())
		require.NoError(t, err)
		ln, err := listen("127.0.0.1:0", &cert)
		require.NoError(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, r.Proto)
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		base := ln.Addr().String()

		client := trusting(t, cert.Leaf)
		client.Transport.(*http.Transport).ForceAttemptHTTP2 = true
		resp, err := client.Get("https://" + base)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, "HTTP/1.1", string(body), "even to a client that asks for HTTP/2")
		resp, err = client.Get("http://" + base)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "cleartext is refused")
	})
	t.Run("the certificate is what Android and iOS accept for the emulator and the simulator", func(t *testing.T) {
		t.Parallel()
		hosts, err := parseHosts(defaultTLSHosts)
		require.NoError(t, err)
		certFile := filepath.Join(t.TempDir(), "fakeserver.pem")
		_, made, err := serverCert(certFile, "", hosts, t0)
		require.NoError(t, err)
		assert.True(t, made)
		cert := readCert(t, certFile)
		for _, h := range []string{"localhost", "127.0.0.1", "::1", "10.0.2.2"} {
			assert.NoError(t, cert.VerifyHostname(h), "names %s", h)
		}
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.0.2.2", CurrentTime: t0,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		require.NoError(t, err, "its own trust anchor")
		// Apple's requirements for TLS server certificates.
		assert.Equal(t, x509.ECDSAWithSHA256, cert.SignatureAlgorithm)
		pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
		require.True(t, ok)
		assert.Equal(t, elliptic.P256(), pub.Curve)
		assert.Contains(t, cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		assert.LessOrEqual(t, cert.NotAfter.Sub(cert.NotBefore), 825*24*time.Hour)
		assert.True(t, cert.NotBefore.Before(t0) && cert.NotAfter.After(t0.Add(300*24*time.Hour)))
	})
	t.Run("with a key file a restart serves the same certificate, and the key is the owner's only", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "fakeserver.pem"), filepath.Join(dir, "fakeserver.key")
		hosts := []string{"localhost"}
		first, made, err := serverCert(certFile, keyFile, hosts, t0)
		require.NoError(t, err)
		assert.True(t, made)
		fi, err := os.Stat(keyFile)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

		again, made, err := serverCert(certFile, keyFile, hosts, t0.Add(24*time.Hour))
		require.NoError(t, err)
		assert.False(t, made)
		assert.Equal(t, first.Certificate[0], again.Certificate[0])
		assert.Equal(t, first.Certificate[0], readCert(t, certFile).Raw)
	})
	t.Run("without a key file every start makes a new certificate", func(t *testing.T) {
		t.Parallel()
		certFile := filepath.Join(t.TempDir(), "fakeserver.pem")
		first, _, err := serverCert(certFile, "", []string{"localhost"}, t0)
		require.NoError(t, err)
		again, made, err := serverCert(certFile, "", []string{"localhost"}, t0)
		require.NoError(t, err)
		assert.True(t, made)
		assert.NotEqual(t, first.Certificate[0], again.Certificate[0])
		assert.Equal(t, again.Certificate[0], readCert(t, certFile).Raw)
	})
	t.Run("a kept certificate that would fail on the device is refused, saying what to do", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "fakeserver.pem"), filepath.Join(dir, "fakeserver.key")
		_, _, err := serverCert(certFile, keyFile, []string{"localhost"}, t0)
		require.NoError(t, err)
		kept, err := os.ReadFile(certFile)
		require.NoError(t, err)

		_, _, err = serverCert(certFile, keyFile, []string{"localhost", "192.168.1.20"}, t0)
		require.ErrorContains(t, err, "does not name 192.168.1.20")
		assert.ErrorContains(t, err, "delete "+certFile+" and "+keyFile)
		_, _, err = serverCert(certFile, keyFile, []string{"localhost"}, t0.Add(certValidity+time.Hour))
		require.ErrorContains(t, err, "not now")
		now, err := os.ReadFile(certFile)
		require.NoError(t, err)
		assert.Equal(t, kept, now, "the file the devices trust is left as it was")

		require.NoError(t, os.WriteFile(keyFile, []byte("not a key"), 0o600))
		_, _, err = serverCert(certFile, keyFile, []string{"localhost"}, t0)
		require.ErrorContains(t, err, "delete both")
	})

	t.Run("the TLS flags are checked", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		tests := []struct {
			name string
			args []string
			msg  string
		}{
			{"a key file without -tls", []string{"-tls-key", filepath.Join(dir, "k")}, "-tls-key and -tls-hosts need -tls FILE"},
			{"hosts without -tls", []string{"-tls-hosts", "example.test"}, "-tls-key and -tls-hosts need -tls FILE"},
			{"one file for both", []string{"-tls", filepath.Join(dir, "x"), "-tls-key", filepath.Join(dir, "x")}, "must be two files"},
			{"no host", []string{"-tls", filepath.Join(dir, "c"), "-tls-hosts", " , "}, "-tls-hosts names no host"},
			{"a URL for a host", []string{"-tls", filepath.Join(dir, "c"), "-tls-hosts", "https://example.test"}, "neither a host name nor an IP address"},
		}
		for _, tt := range tests {
			t.Run(tt.name+" is refused", func(t *testing.T) {
				var buf strings.Builder
				assert.Equal(t, 2, run(tt.args, &buf))
				assert.Contains(t, buf.String(), tt.msg)
			})
		}
		t.Run("-h describes -tls", func(t *testing.T) {
			var buf strings.Builder
			assert.Equal(t, 0, run([]string{"-h"}, &buf))
			assert.Contains(t, buf.String(), "-tls-key")
			assert.Contains(t, buf.String(), "10.0.2.2")
		})
	})
}
