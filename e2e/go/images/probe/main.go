// Command probe is the test workload of the local end-to-end cluster.
//
// From inside its container it reports what it was given: every device node
// under /dev (recursively, so /dev/infiniband/uverbsN and /dev/neuronN show),
// its environment, and every file under the device attributes directory
// (KEP-5304: mounted by the drivers' CDI specs) with its size and SHA-256, so
// a test compares it with the file on the host; in a line format tests parse:
//
//	probe-begin
//	dev <path> <char|block> <major>:<minor>
//	env <NAME>=<value>
//	file <path> <size> <sha256 hex>
//	probe-end
//
// then it sleeps until SIGTERM/SIGINT, so the pod stays Running and its claims
// stay prepared while a test inspects them.
package main

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
)

func main() {
	fmt.Println("probe-begin")
	var devices []string
	walkErr := filepath.WalkDir("/dev", func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			// An unreadable directory is reported, not fatal: the rest still tells the story.
			fmt.Printf("error %s %v\n", path, err)
			return nil
		}
		mode := entry.Type()
		if mode&fs.ModeDevice == 0 {
			return nil
		}
		info, err := os.Lstat(path)
		if err != nil {
			fmt.Printf("error %s %v\n", path, err)
			return nil
		}
		kind := "block"
		if mode&fs.ModeCharDevice != 0 {
			kind = "char"
		}
		rdev := uint64(0)
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			rdev = uint64(st.Rdev)
		}
		devices = append(devices, fmt.Sprintf("dev %s %s %d:%d", path, kind, major(rdev), minor(rdev)))
		return nil
	})
	if walkErr != nil {
		fmt.Printf("error /dev %v\n", walkErr)
	}
	sort.Strings(devices)
	for _, line := range devices {
		fmt.Println(line)
	}
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Printf("env %s\n", kv)
	}
	reportFiles(attributesDir)
	fmt.Println("probe-end")

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
}

// attributesDir is where device attributes files appear in a container.
const attributesDir = "/var/run/kubernetes.io/dra-device-attributes"

// reportFiles prints a file line for every regular file under dir; a missing
// dir prints nothing (a pod without such files), other errors are reported.
func reportFiles(dir string) {
	err := filepath.WalkDir(dir, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			if !os.IsNotExist(err) {
				fmt.Printf("error %s %v\n", path, err)
			}
			return nil
		}
		if !entry.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Printf("error %s %v\n", path, err)
			return nil
		}
		fmt.Printf("file %s %d %x\n", path, len(data), sha256.Sum256(data))
		return nil
	})
	if err != nil {
		fmt.Printf("error %s %v\n", dir, err)
	}
}

// major and minor decode a Linux dev_t the way glibc's gnu_dev_major/minor do.
func major(dev uint64) uint64 { return ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xfffff000) }
func minor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) & 0xffffff00) }
