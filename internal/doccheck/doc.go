// Package doccheck holds the tests that keep the repository's Markdown
// documents true: every Go snippet is the text of a function the tests run
// or a program they build (the server's is examples/server/main.go, which
// its own tests run against PostgreSQL and certify with idemcheck),
// every relative link leads to a file or heading that exists, the README
// stays short, and the licence files are the Apache-2.0 text in each
// module.
//
// A Go snippet is marked by an HTML comment on the line before its fence:
//
//	<!-- doccheck: snippet FILE FUNC -->   the block is a run of lines of
//	                                       func FUNC in FILE (whole, or its
//	                                       body one tab less indented)
//	<!-- doccheck: program NAME -->        the block is a main package,
//	                                       built by the tests
//
// FILE is relative to the repository's root. An unmarked Go block fails
// the tests.
//
// The Go named outside the blocks is checked too: every identifier of
// idem's packages in a code span of the prose (persist.PruneFunc,
// Client.Prune) must exist (names_test.go).
package doccheck
