module github.com/idemkit/idem/mobile/bind

go 1.26.0

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	golang.org/x/mobile v0.0.0-20261011034528-197770444867
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/gofrs/flock v0.13.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.13.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/tools v0.52.0 // indirect
)

replace github.com/idemkit/idem => ../..

tool golang.org/x/mobile/cmd/gobind
