package persist_test

import (
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"testing"
)

func mustWrite(t *testing.T, f *strictFS, dir, data string, sync bool) string {
	t.Helper()
	fl, err := f.CreateTemp(dir, "t-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := fl.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := fl.Close(); err != nil {
		t.Fatal(err)
	}
	return fl.Name()
}

func read(f *strictFS, p string) string {
	b, err := f.ReadFile(p, math.MaxInt64)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestStrictFS: the file system of the power-cut test forgets at a
// restart what was not synced, and nothing else.
func TestStrictFS(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"a restart keeps what was synced and may lose the rest", restartForgetsUnsynced},
		{"a restart keeps a prefix of a directory's changes", restartKeepsAPrefix},
		{"the cut comes after n changes and stops every call", cutAfter},
		{"a rename across directories survives whole or not at all", renameAcrossDirectories},
		{"a stamp follows what survives", stampFollowsWhatSurvives},
	} {
		t.Run(c.name, c.run)
	}
}

// restartForgetsUnsynced checks the file system's one promise: what was
// synced survives a restart, whatever the seed, and what was not is lost
// with some seeds.
func restartForgetsUnsynced(t *testing.T) {
	lostDir, tornFile := 0, 0
	for seed := range uint64(50) {
		f := newStrictFS()
		if err := f.Mkdir("/d", 0o700); err != nil {
			t.Fatal(err)
		}
		if err := f.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		a := mustWrite(t, f, "/d", "synced", true)
		if err := f.Rename(a, "/d/a"); err != nil {
			t.Fatal(err)
		}
		if err := f.SyncDir("/d"); err != nil {
			t.Fatal(err)
		}
		b := mustWrite(t, f, "/d", "data not synced", false)
		if err := f.Rename(b, "/d/b"); err != nil {
			t.Fatal(err)
		}
		c := mustWrite(t, f, "/d", "synced, renamed, synced", true)
		if err := f.Rename(c, "/d/a"); err != nil {
			t.Fatal(err)
		}
		if err := f.SyncDir("/d"); err != nil {
			t.Fatal(err)
		}
		if err := f.Remove("/d/a"); err != nil {
			t.Fatal(err)
		}
		if err := f.Mkdir("/e", 0o700); err != nil {
			t.Fatal(err)
		}
		f.Restart(rand.New(rand.NewPCG(seed, 0)))

		if got := read(f, "/d/a"); got != "synced, renamed, synced" && got != "<open /d/a: file does not exist>" {
			t.Errorf("seed %d: /d/a = %q", seed, got)
		}
		got := read(f, "/d/b")
		if len(got) > len("data not synced") || got != "data not synced"[:len(got)] {
			t.Errorf("seed %d: /d/b = %q, want a prefix of its data", seed, got)
		}
		if got != "data not synced" {
			tornFile++
		}
		if _, err := f.Stat("/e"); errors.Is(err, fs.ErrNotExist) {
			lostDir++
		}
	}
	if lostDir == 0 || tornFile == 0 {
		t.Errorf("of 50 restarts, %d lost an unsynced directory entry and %d unsynced data; want some of each", lostDir, tornFile)
	}
}

// restartKeepsAPrefix checks that of a directory's unsynced changes a
// restart keeps a prefix, in order, and across seeds every prefix.
func restartKeepsAPrefix(t *testing.T) {
	seen := map[string]bool{}
	for seed := range uint64(200) {
		f := newStrictFS()
		for _, name := range []string{"/1", "/2", "/3"} {
			if err := f.Mkdir(name, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		f.Restart(rand.New(rand.NewPCG(seed, 0)))
		got := ""
		for _, name := range []string{"/1", "/2", "/3"} {
			if _, err := f.Stat(name); err == nil {
				got += name
			}
		}
		seen[got] = true
	}
	for k := range seen {
		switch k {
		case "", "/1", "/1/2", "/1/2/3":
		default:
			t.Errorf("a restart kept %q, not a prefix", k)
		}
	}
	if len(seen) != 4 {
		t.Errorf("restarts kept %v; want every prefix", seen)
	}
}

// cutAfter checks that the cut comes after exactly n changes and stops
// every call until Restart, which also releases locks.
func cutAfter(t *testing.T) {
	f := newStrictFS()
	f.CutAfter(2)
	if _, err := f.Lock("/"); err != nil {
		t.Fatal(err)
	}
	if err := f.Mkdir("/a", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := f.Mkdir("/b", 0o700); !errors.Is(err, errPowerCut) {
		t.Fatalf("third change: %v, want errPowerCut", err)
	}
	if _, err := f.Stat("/a"); !errors.Is(err, errPowerCut) {
		t.Fatalf("a read with the power off: %v", err)
	}
	if !f.Off() || f.Changes() != 2 {
		t.Fatalf("Off %v, Changes %d", f.Off(), f.Changes())
	}
	f.Restart(rand.New(rand.NewPCG(1, 0)))
	if _, err := f.Lock("/"); err != nil {
		t.Fatalf("lock after a restart: %v", err)
	}
	if _, err := f.Lock("/"); err == nil {
		t.Fatal("a second lock was granted")
	}
}

// renameAcrossDirectories checks that a power cut keeps a rename across
// directories whole or not at all, and that once the target directory is
// synced the file is never lost, though it may be found in both.
func renameAcrossDirectories(t *testing.T) {
	for _, syncTarget := range []bool{false, true} {
		seen := map[string]bool{}
		for seed := range uint64(100) {
			f := newStrictFS()
			for _, d := range []string{"/a", "/b"} {
				if err := f.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.SyncDir("/"); err != nil {
				t.Fatal(err)
			}
			tmp := mustWrite(t, f, "/a", "x", true)
			if err := f.Rename(tmp, "/a/x"); err != nil {
				t.Fatal(err)
			}
			if err := f.SyncDir("/a"); err != nil {
				t.Fatal(err)
			}
			if err := f.Rename("/a/x", "/b/x"); err != nil {
				t.Fatal(err)
			}
			if syncTarget {
				if err := f.SyncDir("/b"); err != nil {
					t.Fatal(err)
				}
			}
			f.Restart(rand.New(rand.NewPCG(seed, 0)))
			where := ""
			for _, p := range []string{"/a/x", "/b/x"} {
				if read(f, p) == "x" {
					where += p
				}
			}
			seen[where] = true
		}
		want := map[string]bool{"/a/x": true, "/b/x": true}
		if syncTarget {
			want = map[string]bool{"/a/x/b/x": true, "/b/x": true}
		}
		for w := range seen {
			if !want[w] {
				t.Errorf("target synced %v: a restart left the file at %q", syncTarget, w)
			}
		}
		if len(seen) != len(want) {
			t.Errorf("target synced %v: restarts left %v, want each of %v", syncTarget, seen, want)
		}
	}
}

// stampFollowsWhatSurvives: a directory's stamp changes with every
// change of its entries, and after a restart it is the stamp of the state
// that survived: the synced one if the later change was lost, the later
// one if it was kept. A file's stamp changes when it is written.
func stampFollowsWhatSurvives(t *testing.T) {
	kept, lost := 0, 0
	for seed := uint64(1); seed <= 40; seed++ {
		f := newStrictFS()
		a := mustWrite(t, f, "/", "a", true)
		if err := f.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		synced, _ := f.Stamp("/")
		fa, _ := f.Stamp(a)
		b := mustWrite(t, f, "/", "b", true)
		later, _ := f.Stamp("/")
		if later == synced {
			t.Fatal("creating a file left the directory's stamp as it was")
		}
		if fb, _ := f.Stamp(b); fb == fa {
			t.Fatal("two files share a stamp")
		}
		f.Restart(rand.New(rand.NewPCG(seed, 7)))
		now, err := f.Stamp("/")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Stamp(b); err == nil {
			kept++
			if now != later {
				t.Fatalf("seed %d: b survived, but the directory's stamp is not the one after its creation", seed)
			}
		} else {
			lost++
			if now != synced {
				t.Fatalf("seed %d: b was lost, but the directory's stamp is not the synced one", seed)
			}
		}
		if st, _ := f.Stamp(a); st != fa {
			t.Fatalf("seed %d: a synced file's stamp changed in a restart", seed)
		}
	}
	if kept == 0 || lost == 0 {
		t.Fatalf("40 seeds kept the unsynced file %d times and lost it %d times: both should happen", kept, lost)
	}
}
