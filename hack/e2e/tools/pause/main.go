// Command pause is the sandbox ("pause") process of the real node's pods in the e2e tier: the image
// containerd starts first in every pod, holding its namespaces. It sleeps until SIGINT or SIGTERM and,
// as the pod's PID 1 when the pod shares its process namespace, reaps the children that are handed to it.
// No registry can be reached from the tier, so tests/e2e/node.py packs this binary into an OCI archive
// and imports it into containerd.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
