// Package boltbench compares idem's file store with a store on
// go.etcd.io/bbolt. That comparison made the file store the default
// (docs/BENCHMARKS.md). It is a module of its own, so that idem's go.mod
// does not depend on bbolt. Run it from this directory with
//
//	go test -run '^$' -bench . -benchtime 100x
//	go test -run '^$' -bench OpenList -args -bench100k
package boltbench
