package pgtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		binGlob = "/nonexistent/postgresql/*/bin" // a machine without PostgreSQL
	}
	os.Exit(Main(m))
}

// envChild marks a run of this test binary by TestDSN's test without
// PostgreSQL.
const envChild = "PGTEST_CHILD_WITHOUT_POSTGRES"

// TestDSN checks the databases DSN gives tests, and what a test without
// PostgreSQL does.
func TestDSN(t *testing.T) {
	t.Run("gives each test an empty database", func(t *testing.T) {
		var names [2]string
		for i := range names {
			dsn := DSN(t)
			conn, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if err := conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&names[i]); err != nil {
				t.Fatal(err)
			}
			var tables int
			if err := conn.QueryRow(context.Background(),
				"SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&tables); err != nil {
				t.Fatal(err)
			}
			if tables != 0 {
				t.Errorf("database %s has %d tables, want 0", names[i], tables)
			}
		}
		if names[0] == names[1] {
			t.Errorf("two DSN calls gave the same database %s", names[0])
		}
	})

	// The subtest above, run in a child process that has no DSN and finds
	// no binaries, skips, saying how to enable it, or fails under
	// IDEM_REQUIRE_POSTGRES=1.
	t.Run("without PostgreSQL a test skips or fails as asked", func(t *testing.T) {
		if os.Getenv(envChild) == "1" {
			t.Skip("the child runs only the database test")
		}
		for _, c := range []struct {
			require string
			wantErr bool
			want    string
		}{
			{"", false, "--- SKIP: TestDSN/gives_each_test_an_empty_database"},
			{"1", true, "--- FAIL: TestDSN/gives_each_test_an_empty_database"},
		} {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestDSN$/^gives_each_test_an_empty_database$", "-test.v")
			cmd.Env = append(os.Environ(), envChild+"=1", EnvDSN+"=", EnvRequire+"="+c.require, "PATH="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if (err != nil) != c.wantErr || !strings.Contains(string(out), c.want) {
				t.Errorf("%s=%q: err %v, output:\n%s", EnvRequire, c.require, err, out)
			}
			if !strings.Contains(string(out), "set "+EnvDSN) {
				t.Errorf("%s=%q: the output does not say how to enable the tests:\n%s", EnvRequire, c.require, out)
			}
		}
	})
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:p@h:5/old?sslmode=disable": "postgres://u:p@h:5/new?sslmode=disable",
		"postgresql://h/":                        "postgresql://h/new",
		"host=h user=u dbname=old":               "host=h user=u dbname=old dbname=new",
	} {
		got, err := WithDatabase(in, "new")
		if err != nil || got != want {
			t.Errorf("WithDatabase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
