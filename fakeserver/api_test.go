package fakeserver_test

import (
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPublicAPI checks what a user of the fake server can see: what go doc
// shows them must be importable by them.
func TestPublicAPI(t *testing.T) {
	t.Parallel()
	paths := []string{"github.com/idemkit/idem/fakeserver", "github.com/idemkit/idem/fakeserver/pgfake"}
	imp := exportImporter(t, paths...)
	for _, path := range paths {
		t.Run(path+" names no internal package", func(t *testing.T) {
			pkg, err := imp.Import(path)
			require.NoError(t, err)
			assert.Empty(t, internalNames(pkg), "exported names whose types come from an internal package")
		})
	}
	t.Run("Options has no switch that turns the contract off", func(t *testing.T) {
		pkg, err := imp.Import(paths[0])
		require.NoError(t, err)
		opts := pkg.Scope().Lookup("Options").Type().Underlying().(*types.Struct)
		for i := range opts.NumFields() {
			f := opts.Field(i)
			if f.Exported() && types.Identical(f.Type(), types.Typ[types.Bool]) {
				assert.Contains(t, []string{"RequireUUID"}, f.Name(), "a boolean field of Options that is not a setting of the contract")
			}
		}
	})
}

// exportImporter returns an importer of paths and their dependencies
// from the export data go list leaves in the build cache.
func exportImporter(t *testing.T, paths ...string) types.Importer {
	t.Helper()
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, paths...)...).Output()
	require.NoError(t, err)
	files := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, file, _ := strings.Cut(line, "\t")
		files[path] = file
	}
	return importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		if files[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(files[path])
	})
}

// internalNames returns the exported names of pkg whose declared types
// (fields, parameters, results, methods) mention a type of an internal
// package.
func internalNames(pkg *types.Package) []string {
	var bad []string
	seen := map[types.Type]bool{}
	var mentions func(types.Type) bool
	mentions = func(t types.Type) bool {
		if seen[t] {
			return false
		}
		seen[t] = true
		switch t := t.(type) {
		case *types.Named:
			if p := t.Obj().Pkg(); p != nil && (strings.Contains(p.Path(), "/internal/") || strings.HasSuffix(p.Path(), "/internal")) {
				return true
			}
			if t.Obj().Pkg() != pkg {
				return false // another package's API is its own test's
			}
			return mentions(t.Underlying())
		case *types.Alias:
			return mentions(types.Unalias(t))
		case *types.Pointer:
			return mentions(t.Elem())
		case *types.Slice:
			return mentions(t.Elem())
		case *types.Array:
			return mentions(t.Elem())
		case *types.Map:
			return mentions(t.Key()) || mentions(t.Elem())
		case *types.Chan:
			return mentions(t.Elem())
		case *types.Signature:
			return mentions(t.Params()) || mentions(t.Results())
		case *types.Tuple:
			for i := range t.Len() {
				if mentions(t.At(i).Type()) {
					return true
				}
			}
		case *types.Struct:
			for i := range t.NumFields() {
				if f := t.Field(i); (f.Exported() || f.Embedded()) && mentions(f.Type()) {
					return true
				}
			}
		case *types.Interface:
			for i := range t.NumMethods() {
				if m := t.Method(i); m.Exported() && mentions(m.Type()) {
					return true
				}
			}
		}
		return false
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		clear(seen)
		if mentions(obj.Type()) {
			bad = append(bad, name)
		}
		if tn, ok := obj.(*types.TypeName); ok {
			if named, ok := tn.Type().(*types.Named); ok {
				for i := range named.NumMethods() {
					m := named.Method(i)
					clear(seen)
					if m.Exported() && mentions(m.Type()) {
						bad = append(bad, name+"."+m.Name())
					}
				}
			}
		}
	}
	return bad
}
