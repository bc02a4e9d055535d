// csi-registrar registers one CSI driver with the kubelet of its node, as
// Kubernetes' node-driver-registrar sidecar does, and nothing more: it serves
// kubelet's plugin registration API (k8s.io/kubelet pluginregistration/v1)
// on <registration-dir>/<driver>-reg.sock, answering GetInfo with the
// driver's name, its CSI socket and the version "1.0.0", and logs what
// kubelet reports back. kubelet then talks to the driver's socket itself.
//
// The test bed builds it because no node-driver-registrar can be fetched
// here: the Go module proxy refuses v1.3.0, and v2.x's go.mod lacks the /v2
// suffix, so no v2 version resolves (docs/testbed.md, "Shared storage").
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registration.UnimplementedRegistrationServer
	driver   string
	endpoint string
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	log.Printf("kubelet asks for the plugin's info: %s at %s", r.driver, r.endpoint)
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, status *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if status.PluginRegistered {
		log.Printf("kubelet registered %s", r.driver)
	} else {
		log.Printf("kubelet refused %s: %s", r.driver, status.Error)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

func main() {
	driver := flag.String("driver-name", "", "the CSI driver's name")
	endpoint := flag.String("csi-address", "", "the driver's socket, as a path kubelet can dial")
	dir := flag.String("registration-dir", "", "kubelet's plugins_registry directory")
	flag.Parse()
	if *driver == "" || *endpoint == "" || *dir == "" {
		log.Fatal("--driver-name, --csi-address and --registration-dir are required")
	}
	// Register only once the driver serves: kubelet dials it at once.
	for {
		if info, err := os.Stat(*endpoint); err == nil && info.Mode()&os.ModeSocket != 0 {
			break
		}
		log.Printf("waiting for the driver's socket %s", *endpoint)
		time.Sleep(time.Second)
	}
	socket := filepath.Join(*dir, *driver+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing a stale %s: %v", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listening on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	registration.RegisterRegistrationServer(server, &registrar{driver: *driver, endpoint: *endpoint})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		// Removing the socket is how kubelet learns the plugin is gone.
		server.Stop()
		os.Remove(socket)
		os.Exit(0)
	}()
	log.Printf("serving registration of %s on %s", *driver, socket)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
