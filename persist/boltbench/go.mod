module github.com/idemkit/idem/persist/boltbench

go 1.25.0

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	go.etcd.io/bbolt v1.5.0
)

require (
	github.com/gofrs/flock v0.13.1 // indirect
	golang.org/x/sys v0.47.0 // indirect
)

replace github.com/idemkit/idem => ../..
