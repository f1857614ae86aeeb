package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"strings"
	"time"
)

// defaultTLSHosts are the names a device reaches the host's loopback by.
// localhost and 127.0.0.1 serve the host, an iOS simulator, and an
// Android device after adb reverse. 10.0.2.2 serves the Android emulator.
const defaultTLSHosts = "localhost,127.0.0.1,::1,10.0.2.2"

// certValidity is how long a generated certificate lasts. iOS refuses a
// TLS server certificate valid for more than 825 days. It does so even
// for a root the user trusts.
const certValidity = 365 * 24 * time.Hour

// parseHosts splits a comma-separated list of names and IP addresses.
func parseHosts(list string) ([]string, error) {
	var hosts []string
	for h := range strings.SplitSeq(list, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if strings.ContainsAny(h, " /:") && net.ParseIP(h) == nil {
			return nil, fmt.Errorf("-tls-hosts: %q is neither a host name nor an IP address", h)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return nil, errors.New("-tls-hosts names no host")
	}
	return hosts, nil
}

// serverCert returns the certificate to serve. With keyFile set and both
// files present, it is the one they hold. So what a device was told to
// trust still holds after a restart. That certificate must name every
// host and be valid at now. Otherwise serverCert makes a new one for
// hosts. When keyFile is set, it writes the certificate to certFile (PEM)
// and its key to keyFile (mode 0600). It reports whether it made a new
// one.
func serverCert(certFile, keyFile string, hosts []string, now time.Time) (tls.Certificate, bool, error) {
	if keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		switch {
		case err == nil:
			return cert, false, checkCert(cert.Leaf, certFile, keyFile, hosts, now)
		case !errors.Is(err, fs.ErrNotExist):
			return tls.Certificate{}, false, fmt.Errorf("-tls %s with -tls-key %s: %w; delete both to have new ones made", certFile, keyFile, err)
		}
		// One is missing: make both anew.
	}
	cert, keyPEM, err := newCert(hosts, now)
	if err != nil {
		return tls.Certificate{}, false, err
	}
	if keyFile != "" {
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			return tls.Certificate{}, false, fmt.Errorf("-tls-key: %w", err)
		}
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return tls.Certificate{}, false, fmt.Errorf("-tls: %w", err)
	}
	return cert, true, nil
}

// checkCert refuses a kept certificate that would fail on a device. That
// is one expired, or one that does not name a host asked for.
func checkCert(leaf *x509.Certificate, certFile, keyFile string, hosts []string, now time.Time) error {
	remake := fmt.Sprintf("delete %s and %s to have new ones made, and have the devices trust the new certificate", certFile, keyFile)
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return fmt.Errorf("the certificate in %s is valid from %s to %s, not now; %s",
			certFile, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339), remake)
	}
	for _, h := range hosts {
		if err := leaf.VerifyHostname(h); err != nil {
			return fmt.Errorf("the certificate in %s does not name %s (-tls-hosts); %s", certFile, h, remake)
		}
	}
	return nil
}

// newCert makes a self-signed certificate for hosts, and returns it with
// its key in PEM. It is valid from an hour before now, for certValidity.
// It is its own root, as httptest's is. So a device that trusts it trusts
// the server. It meets Apple's rules for TLS server certificates: ECDSA
// P-256 with SHA-256, the hosts in the subject alternative names, the
// serverAuth extended key usage, at most 825 days.
func newCert(hosts []string, now time.Time) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("-tls: make a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("-tls: make a serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "idem fakeserver", Organization: []string{"idem fakeserver, for tests only"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("-tls: make the certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("-tls: read the certificate back: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("-tls: encode the key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, keyPEM, nil
}

// fingerprint is the certificate's SHA-256 digest in hex, as a pin or a
// device's certificate details show it.
func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}
