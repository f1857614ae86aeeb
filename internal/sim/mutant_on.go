//go:build idem_mutant

package sim

// mutantBuild is true in a build with the idem_mutant tag.
const mutantBuild = true
