package doccheck

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSnippets checks that the documents' Go blocks are code the tests
// compile.
func TestSnippets(t *testing.T) {
	// Each Go block of the documents is either the text of a function in a
	// file the tests compile (and, for an Example, run), or a program that
	// the next subtest builds.
	t.Run("every Go block is checked", func(t *testing.T) {
		snippets := 0
		for _, doc := range documents(t) {
			rel, _ := filepath.Rel(root, doc)
			for _, b := range Blocks(read(t, doc)) {
				if b.Lang != "go" {
					continue
				}
				where := rel + ":" + strconv.Itoa(b.Line)
				kind, args, _ := strings.Cut(b.Marker, " ")
				switch kind {
				case "snippet":
					file, fn, ok := strings.Cut(args, " ")
					if !assert.True(t, ok, "%s: want <!-- doccheck: snippet FILE FUNC -->", where) {
						continue
					}
					assert.True(t, isRunOfLines(b.Text, functionTexts(t, filepath.Join(root, file), fn)),
						"%s: the snippet is not a run of lines of func %s in %s:\n%s", where, fn, file, b.Text)
					snippets++
				case "program":
					snippets++
				default:
					t.Errorf("%s: a Go block without a doccheck marker (snippet FILE FUNC, or program NAME)", where)
				}
			}
		}
		assert.Positive(t, snippets)
	})

	// Each is its own main package inside this module.
	t.Run("the program blocks build", func(t *testing.T) {
		for name := range programs(t) {
			t.Run(name, func(t *testing.T) { buildProgram(t, name) })
		}
	})
}

// programs returns the program blocks by name.
func programs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, doc := range documents(t) {
		for _, b := range Blocks(read(t, doc)) {
			if name, ok := strings.CutPrefix(b.Marker, "program "); ok && b.Lang == "go" {
				require.NotContains(t, out, name, "two programs named %s", name)
				out[name] = b.Text
			}
		}
	}
	return out
}

// buildProgram builds the program block name and returns the binary.
func buildProgram(t *testing.T, name string) string {
	t.Helper()
	src, ok := programs(t)[name]
	require.True(t, ok, "no program block named %s", name)
	// The package must be inside the module to import idem's packages.
	wd, err := os.Getwd()
	require.NoError(t, err)
	pkg, err := os.MkdirTemp(wd, "program-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(pkg) })
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src), 0o644))
	bin := filepath.Join(t.TempDir(), name)
	var out bytes.Buffer
	cmd := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(pkg))
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "go build of the %s program:\n%s", name, out.String())
	vet := exec.Command("go", "vet", "./"+filepath.Base(pkg))
	vout, err := vet.CombinedOutput()
	require.NoError(t, err, "go vet of the %s program:\n%s", name, vout)
	return bin
}

// functionTexts returns the texts a snippet of func name in file may be cut
// from: the declaration as written, and its body one tab less indented.
func functionTexts(t *testing.T, file, name string) []string {
	t.Helper()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	require.NoError(t, err)
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != name {
			continue
		}
		decl := string(src[fset.Position(fd.Pos()).Offset:fset.Position(fd.End()).Offset]) + "\n"
		body := string(src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset])
		var lines []string
		for _, l := range strings.Split(strings.Trim(body, "\n"), "\n") {
			lines = append(lines, strings.TrimPrefix(l, "\t"))
		}
		return []string{decl, strings.Join(lines, "\n") + "\n"}
	}
	t.Fatalf("no func %s in %s", name, file)
	return nil
}

// isRunOfLines reports whether snippet's lines appear, consecutive and
// whole, in one of the texts.
func isRunOfLines(snippet string, texts []string) bool {
	want := strings.Split(strings.TrimRight(snippet, "\n"), "\n")
	for _, text := range texts {
		lines := strings.Split(text, "\n")
		for i := 0; i+len(want) <= len(lines); i++ {
			if equalLines(lines[i:i+len(want)], want) {
				return true
			}
		}
	}
	return false
}

func equalLines(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
