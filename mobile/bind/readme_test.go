package bind

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/doccheck"
)

// readme is the facade's manual, whose snippets these tests compile.
const readme = "../README.md"

// kotlinBlocks returns the Kotlin blocks of the manual; each must be
// marked for this test.
func kotlinBlocks(t *testing.T) []doccheck.Block {
	t.Helper()
	doc, err := os.ReadFile(readme)
	must(t, err)
	var out []doccheck.Block
	for _, b := range doccheck.Blocks(string(doc)) {
		if b.Lang != "kotlin" {
			continue
		}
		if b.Marker != "kotlin" {
			t.Errorf("mobile/README.md:%d: a Kotlin block without <!-- doccheck: kotlin -->", b.Line)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		t.Fatal("mobile/README.md has no Kotlin block")
	}
	return out
}

// kotlinSource makes one Kotlin file of the blocks: their imports first,
// then each block as the body of a function that is given the Android
// Context and, for the blocks after the first, the client it opened.
func kotlinSource(blocks []doccheck.Block) string {
	imports := map[string]bool{}
	var order []string
	var funcs strings.Builder
	for i, b := range blocks {
		fmt.Fprintf(&funcs, "\n// mobile/README.md:%d\n@Suppress(\"UNUSED_VARIABLE\", \"NAME_SHADOWING\")\nfun snippet%d(context: AppContext, client: dev.idem.mobile.Client) {\n", b.Line, i)
		for _, line := range strings.Split(strings.TrimRight(b.Text, "\n"), "\n") {
			if strings.HasPrefix(line, "import ") {
				if !imports[line] {
					imports[line] = true
					order = append(order, line)
				}
				continue
			}
			funcs.WriteString("    " + line + "\n")
		}
		funcs.WriteString("}\n")
	}
	return strings.Join(order, "\n") + "\n" + funcs.String()
}

// TestKotlinSnippetsCompile compiles the Kotlin blocks of mobile/README.md
// with kotlinc against the generated Java, with stand-ins for Android's
// Context and Log and for the app's screens (testdata/kotlin/Prelude.kt),
// and for the part of WorkManager the README uses (testdata/kotlin/Work.kt).
func TestKotlinSnippetsCompile(t *testing.T) {
	blocks := kotlinBlocks(t)
	kotlinc := requireTool(t, "kotlinc")
	classes := compileJava(t, generate(t))
	work := t.TempDir()
	src := filepath.Join(work, "Snippets.kt")
	must(t, os.WriteFile(src, []byte(kotlinSource(blocks)), 0o644))
	cmd := exec.Command(kotlinc, "-nowarn", "-cp", classes, "-d", filepath.Join(work, "out"),
		filepath.Join("testdata", "kotlin", "Prelude.kt"), filepath.Join("testdata", "kotlin", "Work.kt"), src)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "error:") {
		t.Fatalf("kotlinc: %v\n%s\nsource:\n%s", err, out, kotlinSource(blocks))
	}
	t.Logf("kotlinc compiled %d Kotlin blocks of mobile/README.md", len(blocks))
}

// TestObjectiveCHeadersCompile compiles the generated Objective-C headers
// with clang against GNUstep's Foundation, with testdata/objc/Pay.m, the
// calls of the manual's Swift block, as warnings-are-errors: a wrong name,
// type or nullability of the facade's calls fails it.
func TestObjectiveCHeadersCompile(t *testing.T) {
	clang := requireTool(t, "clang")
	gnustep := requireTool(t, "gnustep-config")
	headers, err := exec.Command(gnustep, "--variable=GNUSTEP_SYSTEM_HEADERS").Output()
	must(t, err)
	system := strings.TrimSpace(string(headers))
	foundation := filepath.Join(system, "Foundation", "Foundation.h")
	if !fileExists(foundation) {
		t.Fatalf("no %s: install gnustep-base-dev (libgnustep-base-dev)", foundation)
	}
	// Debian builds GNUstep for GCC's Objective-C runtime, whose objc/*.h
	// live in GCC's include directory.
	gccInclude, err := exec.Command("gcc", "-print-file-name=include").Output()
	must(t, err)
	gen := filepath.Join(generate(t), "src", "gobind")

	// The generated header says "@import Foundation;": a module map gives
	// GNUstep's Foundation that module name.
	work := t.TempDir()
	modulemap := filepath.Join(work, "module.modulemap")
	must(t, os.WriteFile(modulemap, []byte(fmt.Sprintf(
		"module Foundation [system] {\n  umbrella header %q\n  export *\n}\n", foundation)), 0o644))
	pay, err := filepath.Abs(filepath.Join("testdata", "objc", "Pay.m"))
	must(t, err)
	args := []string{
		"-fsyntax-only", "-x", "objective-c", "-Wall", "-Werror",
		// Without ARC (GCC's runtime has none), a property without
		// strong or copy is assign: a warning about the generated header's
		// ARC-only declarations, not about the facade.
		"-Wno-objc-property-no-attribute",
		"-fmodules", "-fmodules-cache-path=" + filepath.Join(work, "modules"), "-fmodule-map-file=" + modulemap,
		"-DGNUSTEP", "-DGNUSTEP_BASE_LIBRARY=1", "-DGNU_RUNTIME=1", "-fobjc-exceptions",
		"-fconstant-string-class=NSConstantString",
		"-I" + system, "-I" + strings.TrimSpace(string(gccInclude)), "-I" + gen,
	}
	for _, file := range []string{filepath.Join(gen, "Universe.objc.h"), filepath.Join(gen, "Mobile.objc.h"), pay} {
		cmd := exec.Command(clang, append(args, file)...)
		cmd.Dir = gen
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("clang %s: %v\n%s", filepath.Base(file), err, tail(out, 8192))
		}
	}
}
