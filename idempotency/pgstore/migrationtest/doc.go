// Package migrationtest applies pgstore's migrations with the tools teams
// run them with, goose v3 and golang-migrate v4, to real PostgreSQL. It is
// a module of its own so that idem's go.mod does not depend on the tools;
// it holds tests only. Its module path lies under idem's, so its tests may
// use idem's internal/pgtest.
package migrationtest
