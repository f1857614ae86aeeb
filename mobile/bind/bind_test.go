package bind

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/fakeserver"
)

// facade is the package bound for Android and iOS.
const facade = "github.com/idemkit/idem/mobile"

// javaPkg is the prefix of the Java package, as mobile/README.md tells
// apps to bind with: the classes are in dev.idem.mobile, not in a bare
// "mobile" that any other gomobile library may use too.
const javaPkg = "dev.idem"

// requireTool finds a program the test needs. Without it the test skips,
// unless IDEM_REQUIRE_JVM=1 (set by CI), when it fails.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("IDEM_REQUIRE_JVM") == "1" {
			t.Fatalf("%s not found and IDEM_REQUIRE_JVM=1: install a JDK, a C compiler, kotlin, clang and libgnustep-base-dev", name)
		}
		t.Skipf("%s not found: install a JDK, a C compiler, kotlin, clang and libgnustep-base-dev, or set IDEM_REQUIRE_JVM=1 to make this a failure", name)
	}
	return p
}

var (
	bindOnce sync.Once
	bindDir  string
	bindOut  []byte
	bindErr  error
)

// generate runs gobind once for the Go, Java and Objective-C bindings.
func generate(t *testing.T) string {
	t.Helper()
	bindOnce.Do(func() {
		bindDir, bindErr = os.MkdirTemp("", "idem-gobind-")
		if bindErr != nil {
			return
		}
		cmd := exec.Command("go", "tool", "gobind", "-lang=go,java,objc", "-javapkg="+javaPkg, "-outdir", bindDir, facade)
		bindOut, bindErr = cmd.CombinedOutput()
	})
	if bindErr != nil {
		t.Fatalf("gobind: %v\n%s", bindErr, bindOut)
	}
	return bindDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{bindDir, javaWork} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// gobind exits 0 when it skips a member it cannot bind, and leaves a
// "skipped" comment in the generated code instead. Every member of the
// facade must bind.
func TestGobindSkipsNoMember(t *testing.T) {
	dir := generate(t)
	var skipped []string
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(data), "\n") {
			if strings.Contains(strings.ToLower(line), "skipped") {
				rel, _ := filepath.Rel(dir, path)
				skipped = append(skipped, fmt.Sprintf("%s:%d: %s", rel, i+1, strings.TrimSpace(line)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"java/dev/idem/mobile/Client.java", "java/dev/idem/mobile/Mobile.java", "src/gobind/Mobile.objc.h"} {
		if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
			t.Errorf("gobind did not generate %s: %v", want, err)
		}
	}
	if len(skipped) > 0 {
		t.Errorf("gobind skipped %d members of %s:\n%s", len(skipped), facade, strings.Join(skipped, "\n"))
	}
	t.Logf("gobind generated %d files, no member skipped", files)
}

// javaHome is the JDK that javac belongs to.
func javaHome(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("JAVA_HOME"); h != "" {
		return h
	}
	javac, err := filepath.EvalSymlinks(requireTool(t, "javac"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(javac))
}

var (
	javaOnce    sync.Once
	javaClasses string
	javaOut     []byte
	javaErr     error
	javaWork    string // removed by TestMain
)

// compileJava compiles the generated Java, a stub of android.content.Context
// (gobind's support code imports it) and the smoke test into a class
// directory, once for all the tests.
func compileJava(t *testing.T, gen string) string {
	t.Helper()
	javac := requireTool(t, "javac")
	javaOnce.Do(func() { javaClasses, javaOut, javaErr = javacAll(javac, gen) })
	if javaErr != nil {
		t.Fatalf("javac: %v\n%s", javaErr, javaOut)
	}
	return javaClasses
}

func javacAll(javac, gen string) (string, []byte, error) {
	work, err := os.MkdirTemp("", "idem-javac-")
	if err != nil {
		return "", nil, err
	}
	javaWork = work
	stub := filepath.Join(work, "stub", "android", "content", "Context.java")
	if err := os.MkdirAll(filepath.Dir(stub), 0o755); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(stub, []byte("package android.content;\n\n// Context stands in for Android's, which gobind's Seq.java imports.\npublic class Context {}\n"), 0o644); err != nil {
		return "", nil, err
	}
	sources := []string{stub, filepath.Join("testdata", "java", "SmokeTest.java")}
	err = filepath.WalkDir(filepath.Join(gen, "java"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".java") {
			sources = append(sources, path)
		}
		return err
	})
	if err != nil {
		return "", nil, err
	}
	classes := filepath.Join(work, "classes")
	out, err := exec.Command(javac, append([]string{"-Xlint:none", "-d", classes}, sources...)...).CombinedOutput()
	return classes, out, err
}

func TestGeneratedJavaCompiles(t *testing.T) {
	classes := compileJava(t, generate(t))
	for _, c := range []string{"dev/idem/mobile/Client.class", "dev/idem/mobile/Mobile.class", "dev/idem/mobile/Result.class", "go/Seq.class"} {
		if _, err := os.Stat(filepath.Join(classes, c)); err != nil {
			t.Errorf("no %s: %v", c, err)
		}
	}
}

// buildJNI builds the Go side as a host libgojni.so: gobind's JNI sources,
// which carry Android file names, built for this machine's OS against the
// JDK's jni.h, with a stand-in for Android's log library.
func buildJNI(t *testing.T, gen string) string {
	t.Helper()
	requireTool(t, "cc")
	jh := javaHome(t)
	if _, err := os.Stat(filepath.Join(jh, "include", "jni.h")); err != nil {
		t.Fatalf("no jni.h under %s (set JAVA_HOME to a JDK): %v", jh, err)
	}
	// The main package must be inside this module to see its go.mod.
	wd, err := os.Getwd()
	must(t, err)
	pkg, err := os.MkdirTemp(wd, "jnihost-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(pkg) })
	src := filepath.Join(gen, "src", "gobind")
	entries, err := os.ReadDir(src)
	must(t, err)
	for _, e := range entries {
		name := e.Name()
		if strings.Contains(name, "darwin") || strings.HasSuffix(name, ".m") || strings.Contains(name, "objc") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, name))
		must(t, err)
		// Go builds *_android.go and *_android.c only for GOOS=android.
		name = strings.Replace(name, "_android.go", "_jni.go", 1)
		name = strings.Replace(name, "_android.c", "_jni.c", 1)
		must(t, os.WriteFile(filepath.Join(pkg, name), data, 0o644))
	}
	stub := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(stub, "android"), 0o755))
	must(t, os.WriteFile(filepath.Join(stub, "android", "log.h"), []byte(androidLogH), 0o644))
	must(t, os.WriteFile(filepath.Join(stub, "log.c"), []byte("void idem_host_log_stub(void) {}\n"), 0o644))
	run(t, stub, nil, "cc", "-c", "-fPIC", "log.c", "-o", "log.o")
	run(t, stub, nil, "ar", "rcs", "liblog.a", "log.o")

	lib := filepath.Join(t.TempDir(), "libgojni.so")
	env := []string{
		"CGO_ENABLED=1",
		// The NDK's jni.h types AttachCurrentThread's argument as JNIEnv**,
		// the JDK's as void**: the same pointer.
		"CGO_CFLAGS=-D__GOBIND_ANDROID__ -Wno-error=incompatible-pointer-types -I" + filepath.Join(jh, "include") +
			" -I" + filepath.Join(jh, "include", "linux") + " -I" + stub,
		"CGO_LDFLAGS=-L" + stub,
	}
	run(t, wd, env, "go", "build", "-buildmode=c-shared", "-o", lib, "./"+filepath.Base(pkg))
	return filepath.Dir(lib)
}

const androidLogH = `/* A stand-in for Android's <android/log.h>: log to stderr. */
#ifndef IDEM_HOST_ANDROID_LOG_H
#define IDEM_HOST_ANDROID_LOG_H
#include <stdio.h>
#define ANDROID_LOG_VERBOSE 2
#define ANDROID_LOG_DEBUG 3
#define ANDROID_LOG_INFO 4
#define ANDROID_LOG_WARN 5
#define ANDROID_LOG_ERROR 6
#define ANDROID_LOG_FATAL 7
#define __android_log_print(prio, tag, ...) (fprintf(stderr, "%s: ", tag), fprintf(stderr, __VA_ARGS__), fprintf(stderr, "\n"))
#define __android_log_write(prio, tag, msg) fprintf(stderr, "%s: %s\n", tag, msg)
#endif
`

// The smoke test's checks, each of which must print PASS.
var jvmChecks = []string{
	"lost response is replayed",
	"decline is a result",
	"cancel from another thread returns promptly",
	"changed cart is blocked while the previous intent is unresolved",
	"directory lock is reported",
	"an exception of another origin is of kind internal",
	"a changed cart of a paid action is already paid",
	"restart then resume reuses the same key",
	"an authorizer that throws is not sent, of kind authorizer",
}

// TestJVMSmoke loads the host libgojni.so into a real JVM with -Xcheck:jni
// and runs SmokeTest.java against a fake server started here.
func TestJVMSmoke(t *testing.T) {
	java := requireTool(t, "java")
	gen := generate(t)
	classes := compileJava(t, gen)
	libDir := buildJNI(t, gen)
	srv := fakeserver.NewServer(&fakeserver.Options{Lease: 30 * time.Second})
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, java, "-Xcheck:jni", "-Djava.library.path="+libDir, "-cp", classes, "SmokeTest", srv.URL)
	cmd.Env = os.Environ()
	// The JVM checks that its signal handlers stay its own; libjsig lets
	// the Go runtime's chain to them, as Android's runtime does.
	if jsig := filepath.Join(javaHome(t), "lib", "libjsig.so"); fileExists(jsig) {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+jsig)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	passed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		// -Xcheck:jni writes its warnings to standard output too.
		if strings.HasPrefix(line, "PASS ") || strings.HasPrefix(line, "FAIL ") {
			t.Log(line)
		}
		if name, ok := strings.CutPrefix(line, "PASS "); ok {
			passed[name] = true
		}
	}
	if err != nil {
		t.Errorf("java: %v\nstderr (last 4 KiB):\n%s", err, tail(stderr.Bytes(), 4096))
	}
	for _, c := range jvmChecks {
		if !passed[c] {
			t.Errorf("JVM check %q did not pass", c)
		}
	}
	if strings.Contains(stderr.String(), "FATAL ERROR in native method") {
		t.Errorf("-Xcheck:jni found a fatal error:\n%s", tail(stderr.Bytes(), 4096))
	}
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(out, 4096))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
