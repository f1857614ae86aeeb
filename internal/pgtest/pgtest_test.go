package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestDSNGivesEachTestAnEmptyDatabase(t *testing.T) {
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
