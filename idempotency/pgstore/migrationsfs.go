package pgstore

import (
	"bytes"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// Migrations returns the schema's migrations as a file system. It is for
// teams that run their migrations with a tool other than [Migrate]. Its
// root directory holds one file per migration, in the order they apply:
//
//	0001_idempotency.up.sql
//	...
//
// The files hold exactly the statements [Migrate] applies. They carry
// golang-migrate's names, so pass the file system to its iofs source.
// They carry goose's annotations too, so goose.NewProvider runs them.
// To PostgreSQL the annotations are comments. There are no down
// migrations, since a rollback of the records table loses every record.
// docs/SERVER.md tells more under "Migrations".
//
// Migrate a database with one tool only. Each tool records its versions
// in a table of its own. So a schema applied by one is unknown to the
// others.
func Migrations() fs.FS {
	ms, err := loadMigrations()
	if err != nil {
		// The tests check the embedded files, so a bad name cannot ship.
		panic(err)
	}
	files := make([]migrationFile, len(ms))
	for i, m := range ms {
		files[i] = migrationFile{
			name: strings.TrimSuffix(m.name, ".sql") + ".up.sql",
			data: []byte(m.sql),
		}
	}
	return migrationsFS(files)
}

// migrationsFS is a flat, read-only directory of migration files, in order.
type migrationsFS []migrationFile

type migrationFile struct {
	name string
	data []byte
}

func (m migrationsFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		return &migrationsDir{fsys: m}, nil
	}
	for _, f := range m {
		if f.name == name {
			return &openMigration{info: f.info(), r: bytes.NewReader(f.data)}, nil
		}
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (m migrationsFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	d := &migrationsDir{fsys: m}
	return d.ReadDir(-1)
}

func (f migrationFile) info() fileInfo {
	return fileInfo{name: f.name, size: int64(len(f.data)), mode: 0o444}
}

// fileInfo describes a migration file or the root directory.
type fileInfo struct {
	name string
	size int64
	mode fs.FileMode
}

func (fi fileInfo) Name() string       { return path.Base(fi.name) }
func (fi fileInfo) Size() int64        { return fi.size }
func (fi fileInfo) Mode() fs.FileMode  { return fi.mode }
func (fi fileInfo) ModTime() time.Time { return time.Time{} }
func (fi fileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi fileInfo) Sys() any           { return nil }

type openMigration struct {
	info fileInfo
	r    *bytes.Reader
}

func (f *openMigration) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *openMigration) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *openMigration) Seek(off int64, whence int) (int64, error) {
	return f.r.Seek(off, whence)
}
func (f *openMigration) Close() error { return nil }

// migrationsDir is the open root directory.
type migrationsDir struct {
	fsys migrationsFS
	next int
}

func (d *migrationsDir) Stat() (fs.FileInfo, error) {
	return fileInfo{name: ".", mode: fs.ModeDir | 0o555}, nil
}
func (d *migrationsDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: ".", Err: fs.ErrInvalid}
}
func (d *migrationsDir) Close() error { return nil }

func (d *migrationsDir) ReadDir(n int) ([]fs.DirEntry, error) {
	left := d.fsys[d.next:]
	if n > 0 && len(left) == 0 {
		return nil, io.EOF
	}
	if n > 0 && n < len(left) {
		left = left[:n]
	}
	out := make([]fs.DirEntry, len(left))
	for i, f := range left {
		out[i] = fs.FileInfoToDirEntry(f.info())
	}
	d.next += len(left)
	return out, nil
}
