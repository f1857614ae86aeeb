package fakeserver

// The names the tests use that are not part of the package's API.
var (
	AccountOf       = accountOf
	ErrUnknownFault = errUnknownFault
	ErrInvalidFault = errInvalidFault
)

const (
	MaxAccountLen           = maxAccountLen
	MaxStatusLen            = maxStatusLen
	MaxFaults               = maxFaults
	ProblemValidationFailed = problemValidationFailed
	ProblemInjectedFault    = problemInjectedFault
)
