package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// apiPackages are the packages a user imports, by the name a document
// qualifies their identifiers with, and their directories.
var apiPackages = map[string]string{
	"idem":        ".",
	"persist":     "persist",
	"persisttest": "persist/persisttest",
	"clock":       "clock",
	"idempotency": "idempotency",
	"pgstore":     "idempotency/pgstore",
	"storetest":   "idempotency/storetest",
	"fakeserver":  "fakeserver",
	"pgfake":      "fakeserver/pgfake",
	"mobile":      "mobile",
}

// namesPending are the documents whose Go names are not checked yet, each
// with what fails in it. Their authors fix them; the check is switched on
// for a document by deleting its line here.
var namesPending = map[string]string{}

var (
	// codeSpan is a Markdown inline code span (one or two backticks).
	codeSpan = regexp.MustCompile("``?([^`\n]+)``?")
	// qualified is an identifier of a package, with the field or method
	// that may follow it: idem.RetryPolicy, persist.Record.Rev.
	qualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	// member is a type's field or method named without its package:
	// Client.Prune, Config.Authorizer.
	member = regexp.MustCompile(`(?:^|[^\w.])([A-Z]\w*)\.([A-Z]\w*)`)
)

// TestGoNames checks the Go names the documents' prose gives.
func TestGoNames(t *testing.T) {
	// Every identifier of idem's packages that the prose of the documents
	// names in a code span exists, as a package-level name
	// (persist.PruneFunc) or as a field or method of a type (Client.Prune,
	// pgstore.Store.Check). The Go blocks are compiled by the tests of
	// snippet_test.go; this is the Go outside them, where a renamed or
	// removed name would otherwise stay.
	t.Run("names in the docs exist", func(t *testing.T) {
		api := loadAPI(t)
		checked := 0
		for _, doc := range documents(t) {
			rel, _ := filepath.Rel(root, doc)
			rel = filepath.ToSlash(rel)
			var bad []string
			for _, span := range codeSpan.FindAllStringSubmatch(outsideCode(read(t, doc)), -1) {
				text := span[1]
				for _, m := range qualified.FindAllStringSubmatch(text, -1) {
					pkg, name, sel := m[1], m[2], m[3]
					if _, ok := apiPackages[pkg]; !ok {
						continue // another package's (http.Client)
					}
					checked++
					if !api.pkg[pkg][name] {
						bad = append(bad, pkg+"."+name)
					} else if sel != "" && api.hasType(name) && !api.member(name, sel) {
						bad = append(bad, pkg+"."+name+"."+sel)
					}
				}
				for _, m := range member.FindAllStringSubmatch(text, -1) {
					typ, sel := m[1], m[2]
					if !api.hasType(typ) {
						continue // not a type of idem's (Long.MAX_VALUE)
					}
					checked++
					if !api.member(typ, sel) {
						bad = append(bad, typ+"."+sel)
					}
				}
			}
			if reason, ok := namesPending[rel]; ok {
				t.Logf("%s: names not checked yet (%s); %d unknown: %v", rel, reason, len(bad), bad)
				continue
			}
			assert.Empty(t, bad, "%s names Go identifiers that idem's packages do not have", rel)
		}
		assert.Positive(t, checked)
	})
}

// api is what the exported declarations of apiPackages define.
type api struct {
	pkg     map[string]map[string]bool // package name: its package-level names
	members map[string]map[string]bool // type name, any package: its fields and methods
}

func (a *api) hasType(name string) bool { return a.members[name] != nil }

func (a *api) member(typ, name string) bool { return a.members[typ][name] }

// loadAPI parses the packages' files, tests included: a document may name
// a test (persist.TestPowerCut).
func loadAPI(t *testing.T) *api {
	t.Helper()
	a := &api{pkg: map[string]map[string]bool{}, members: map[string]map[string]bool{}}
	addMember := func(typ, name string) {
		if a.members[typ] == nil {
			a.members[typ] = map[string]bool{}
		}
		if name != "" {
			a.members[typ][name] = true
		}
	}
	for name, dir := range apiPackages {
		a.pkg[name] = map[string]bool{}
		fset := token.NewFileSet()
		paths, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		require.NoError(t, err)
		var files []*ast.File
		for _, path := range paths {
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			if pn := f.Name.Name; pn == name || pn == name+"_test" {
				files = append(files, f)
			}
		}
		require.NotEmpty(t, files, "package %s in %s", name, dir)
		for _, f := range files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil {
						a.pkg[name][d.Name.Name] = true
						continue
					}
					addMember(receiverType(d.Recv.List[0].Type), d.Name.Name)
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.ValueSpec:
							for _, n := range s.Names {
								a.pkg[name][n.Name] = true
							}
						case *ast.TypeSpec:
							a.pkg[name][s.Name.Name] = true
							addMember(s.Name.Name, "")
							for _, m := range typeMembers(s.Type) {
								addMember(s.Name.Name, m)
							}
						}
					}
				}
			}
		}
	}
	return a
}

// receiverType returns the name of a method's receiver type.
func receiverType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverType(e.X)
	case *ast.IndexExpr:
		return receiverType(e.X)
	case *ast.IndexListExpr:
		return receiverType(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// typeMembers returns the fields of a struct type, embedded ones by their
// type's name, and the methods of an interface type.
func typeMembers(e ast.Expr) []string {
	var list *ast.FieldList
	switch e := e.(type) {
	case *ast.StructType:
		list = e.Fields
	case *ast.InterfaceType:
		list = e.Methods
	default:
		return nil
	}
	var out []string
	for _, f := range list.List {
		for _, n := range f.Names {
			out = append(out, n.Name)
		}
		if len(f.Names) == 0 {
			if n := receiverType(f.Type); n != "" {
				out = append(out, n)
			} else if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				out = append(out, sel.Sel.Name)
			}
		}
	}
	sort.Strings(out)
	return out
}
