package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(envServe); dsn != "" {
		// The test binary started again as a server process of its own
		// (see startServer).
		os.Exit(serve(dsn))
	}
	os.Exit(pgtest.Main(m))
}

// newPool returns a pool on a new database with the schema applied. Each
// of configure, if any, changes the pool's configuration first.
func newPool(t *testing.T, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 30
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// fingerprintV1 is the version 1 fingerprint (method, path and body: from
// before the query counted) of a request whose body is JSON in canonical
// form, as the middleware computes it: SHA-256 over the method and the
// path, each after its length in 8 big-endian bytes, then 'j' and the
// body. Records stored by earlier versions hold such fingerprints.
func fingerprintV1(method, path, canonicalJSON string) [sha256.Size]byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(len(method)))
	b = append(b, method...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(path)))
	b = append(b, path...)
	b = append(b, 'j')
	return sha256.Sum256(append(b, canonicalJSON...))
}
