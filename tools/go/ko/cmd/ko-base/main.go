// Command ko-base lets ko build the scheduler image on a machine that reaches no container
// registry (tools/build-scheduler-image.sh):
//
//	ko-base run -- ko build ...     builds a minimal base image (user 65532 "nonroot", no
//	                                files but /etc/passwd, /etc/group, /home/nonroot and /tmp;
//	                                fixed timestamps, so its digest never changes), serves it
//	                                from a registry on 127.0.0.1 for as long as the command runs
//	                                and hands the command its reference in KO_DEFAULTBASEIMAGE
//	ko-base archive LAYOUT OUT TAG  turns ko's OCI image layout into a reproducible OCI archive
//	                                (tar of an OCI image layout): drops the annotation naming
//	                                that throwaway registry (its port differs on every run),
//	                                names the image TAG, prints the image's digest
//
// ko reads its base image from a registry or from a Docker daemon (pkg/commands/config.go,
// getBaseImage); the throwaway registry is the smallest thing that satisfies it offline.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The platforms the base image offers; ko picks the ones its --platform asks for.
var platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// Annotation ko sets to the base image's reference (here 127.0.0.1:<port>/...).
const baseNameAnnotation = "org.opencontainers.image.base.name"

func main() {
	log.SetFlags(0)
	log.SetPrefix("ko-base: ")
	if len(os.Args) >= 4 && os.Args[1] == "run" && os.Args[2] == "--" {
		os.Exit(run(os.Args[3:]))
	}
	if len(os.Args) == 5 && os.Args[1] == "archive" {
		digest, err := archive(os.Args[2], os.Args[3], os.Args[4])
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(digest)
		return
	}
	log.Fatal("usage: ko-base run -- COMMAND [ARG...] | ko-base archive LAYOUT OUT.tar TAG")
}

// baseLayer is a tar of the files a non-root static binary expects, all stamped 1970-01-01.
func baseLayer() (v1.Layer, error) {
	type entry struct {
		name, body string
		mode       int64
		uid        int
		dir        bool
	}
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, body: "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"},
		{name: "etc/passwd", mode: 0o644, body: "root:x:0:0:root:/root:/sbin/nologin\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: 65532, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: time.Unix(0, 0),
			Typeflag: tar.TypeReg, Size: int64(len(e.body)), Format: tar.FormatPAX,
		}
		if e.dir {
			hdr.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// baseIndex is the base image for every platform: the same layer, a config per platform.
func baseIndex() (v1.ImageIndex, error) {
	layer, err := baseLayer()
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
			Created: v1.Time{Time: time.Unix(0, 0)}, CreatedBy: "ko-base: /etc/passwd, /etc/group, /home/nonroot, /tmp",
		}})
		if err != nil {
			return nil, err
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cfg = cfg.DeepCopy()
		cfg.OS, cfg.Architecture = p.OS, p.Architecture
		cfg.Created = v1.Time{Time: time.Unix(0, 0)}
		cfg.Config.User = "65532"
		cfg.Config.WorkingDir = "/home/nonroot"
		cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			return nil, err
		}
		platform := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	return idx, nil
}

// run serves the base image on 127.0.0.1 while the command runs; returns its exit status.
func run(command []string) int {
	idx, err := baseIndex()
	if err != nil {
		log.Print(err)
		return 1
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Print(err)
		return 1
	}
	server := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = server.Serve(listener) }()
	defer server.Close()

	repo := fmt.Sprintf("%s/gpu-cluster/nonroot-base", listener.Addr())
	ref, err := name.ParseReference(repo+":latest", name.Insecure)
	if err != nil {
		log.Print(err)
		return 1
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		log.Print(err)
		return 1
	}
	digest, err := idx.Digest()
	if err != nil {
		log.Print(err)
		return 1
	}
	base := fmt.Sprintf("%s@%s", repo, digest)
	log.Printf("serving the base image %s", base)

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "KO_DEFAULTBASEIMAGE="+base)
	if err := cmd.Start(); err != nil {
		log.Print(err)
		return 1
	}
	// Pass Ctrl-C and SIGTERM on, then wait for the command as usual.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		log.Print(err)
		return 1
	}
	return 0
}

// layout reads and writes the blobs of an OCI image layout.
type layout string

func (l layout) blob(h v1.Hash) string {
	return filepath.Join(string(l), "blobs", h.Algorithm, h.Hex)
}

func (l layout) read(h v1.Hash) ([]byte, error) {
	return os.ReadFile(l.blob(h))
}

func (l layout) write(data []byte) (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(data))
	if err != nil {
		return h, err
	}
	return h, os.WriteFile(l.blob(h), data, 0o644)
}

// rewrite drops the base-name annotation from the manifest (and, for an index, from every
// manifest it lists); returns the new descriptor and every blob the result references.
func (l layout) rewrite(desc v1.Descriptor, blobs map[v1.Hash]bool) (v1.Descriptor, error) {
	raw, err := l.read(desc.Digest)
	if err != nil {
		return desc, err
	}
	var out []byte
	switch {
	case desc.MediaType.IsIndex():
		var m v1.IndexManifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return desc, err
		}
		for i := range m.Manifests {
			if m.Manifests[i], err = l.rewrite(m.Manifests[i], blobs); err != nil {
				return desc, err
			}
		}
		delete(m.Annotations, baseNameAnnotation)
		out, err = json.Marshal(m)
	case desc.MediaType.IsImage():
		var m v1.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return desc, err
		}
		blobs[m.Config.Digest] = true
		for _, layer := range m.Layers {
			blobs[layer.Digest] = true
		}
		delete(m.Annotations, baseNameAnnotation)
		out, err = json.Marshal(m)
	default:
		return desc, fmt.Errorf("unexpected media type %s", desc.MediaType)
	}
	if err != nil {
		return desc, err
	}
	if desc.Digest, err = l.write(out); err != nil {
		return desc, err
	}
	desc.Size = int64(len(out))
	blobs[desc.Digest] = true
	return desc, nil
}

func archive(dir, out, tag string) (string, error) {
	l := layout(dir)
	raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return "", err
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(raw, &index); err != nil {
		return "", err
	}
	if len(index.Manifests) != 1 {
		return "", fmt.Errorf("%s holds %d images, expected one", dir, len(index.Manifests))
	}
	blobs := map[v1.Hash]bool{}
	top, err := l.rewrite(index.Manifests[0], blobs)
	if err != nil {
		return "", err
	}
	// The name skopeo's oci-archive:FILE:TAG and containerd's import look for.
	top.Annotations = map[string]string{"org.opencontainers.image.ref.name": tag}
	index.Manifests = []v1.Descriptor{top}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return "", err
	}

	files := map[string]func() ([]byte, error){
		"oci-layout": func() ([]byte, error) { return []byte(`{"imageLayoutVersion":"1.0.0"}`), nil },
		"index.json": func() ([]byte, error) { return indexJSON, nil },
	}
	for h := range blobs {
		files[filepath.Join("blobs", h.Algorithm, h.Hex)] = func() ([]byte, error) { return l.read(h) }
	}
	if err := writeTar(out, files); err != nil {
		return "", err
	}
	return top.Digest.String(), nil
}

// writeTar writes the files (and their folders) in name order with fixed owners, modes and
// times, so the same image always gives the same bytes.
func writeTar(out string, files map[string]func() ([]byte, error)) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	tw := tar.NewWriter(f)
	dirs := map[string]bool{}
	for _, n := range names {
		for d := filepath.Dir(n); d != "."; d = filepath.Dir(d) {
			if dirs[d] {
				break
			}
			dirs[d] = true
		}
	}
	var entries []string
	for d := range dirs {
		entries = append(entries, d+"/")
	}
	entries = append(entries, names...)
	sort.Strings(entries)
	for _, n := range entries {
		hdr := &tar.Header{Name: n, ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}
		if strings.HasSuffix(n, "/") {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		data, err := files[n]()
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
