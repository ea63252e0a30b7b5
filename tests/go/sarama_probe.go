// Sarama (github.com/Shopify/sarama) against a kmem broker, driven by tests/test_broker_sarama.py through
// tests/go_probes.py: one command a run, one JSON object on stdout.
//
//	produce BOOTSTRAP TOPIC VERSION CODEC MODE COUNT   COUNT records "TOPIC-MODE-i" to partition 0, MODE sync
//	                                                   (SyncProducer.SendMessages) or async (AsyncProducer)
//	consume BOOTSTRAP TOPIC VERSION COUNT              COUNT records of partition 0 from the oldest offset
//
// VERSION is the protocol Sarama speaks (config.Version, e.g. 0.10.0.0), CODEC none, gzip, snappy, lz4 or
// zstd. Every command answers within its deadline; a failure is answered {"error": ..., ...}.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/Shopify/sarama"
)

const deadline = 30 * time.Second

var codecs = map[string]sarama.CompressionCodec{
	"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP, "snappy": sarama.CompressionSnappy,
	"lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
}

func main() {
	answer, err := run(os.Args[1:])
	if err != nil {
		answer = map[string]interface{}{"error": err.Error()}
	}
	text, _ := json.Marshal(answer)
	fmt.Println(string(text))
}

func run(args []string) (map[string]interface{}, error) {
	if len(args) == 7 && args[0] == "produce" {
		count, err := strconv.Atoi(args[6])
		if err != nil {
			return nil, err
		}
		return produce(args[1], args[2], args[3], args[4], args[5], count)
	}
	if len(args) == 5 && args[0] == "consume" {
		count, err := strconv.Atoi(args[4])
		if err != nil {
			return nil, err
		}
		return consume(args[1], args[2], args[3], count)
	}
	return nil, fmt.Errorf("usage: produce BOOTSTRAP TOPIC VERSION CODEC MODE COUNT | consume BOOTSTRAP TOPIC VERSION COUNT")
}

func config(version string) (*sarama.Config, error) {
	parsed, err := sarama.ParseKafkaVersion(version)
	if err != nil {
		return nil, err
	}
	conf := sarama.NewConfig()
	conf.Version = parsed
	conf.Net.DialTimeout, conf.Net.ReadTimeout, conf.Net.WriteTimeout = deadline, deadline, deadline
	conf.Metadata.Retry.Max = 0
	return conf, nil
}

// produce answers {"offsets": [...]} (sorted) when every record was acknowledged, else {"error": the first
// error, "failed": how many records failed, "offsets": the acknowledged ones}.
func produce(bootstrap, topic, version, codec, mode string, count int) (map[string]interface{}, error) {
	conf, err := config(version)
	if err != nil {
		return nil, err
	}
	compression, known := codecs[codec]
	if !known {
		return nil, fmt.Errorf("unknown codec %q", codec)
	}
	conf.Producer.Compression = compression
	conf.Producer.RequiredAcks = sarama.WaitForAll
	conf.Producer.Partitioner = sarama.NewManualPartitioner
	conf.Producer.Retry.Max = 0 // a refused record is reported, not retried
	conf.Producer.Return.Successes = true
	conf.Producer.Return.Errors = true
	conf.Producer.Flush.Messages = count // one request for all of them: a compressed set holds them all
	conf.Producer.Flush.Frequency = 100 * time.Millisecond
	messages := make([]*sarama.ProducerMessage, count)
	for i := range messages {
		value := fmt.Sprintf("%s-%s-%d", topic, mode, i)
		messages[i] = &sarama.ProducerMessage{Topic: topic, Partition: 0, Value: sarama.StringEncoder(value)}
	}
	offsets := []int64{}
	var failures []error
	switch mode {
	case "sync":
		producer, err := sarama.NewSyncProducer([]string{bootstrap}, conf)
		if err != nil {
			return nil, err
		}
		defer producer.Close()
		err = producer.SendMessages(messages)
		failed := map[*sarama.ProducerMessage]bool{}
		var produceErrors sarama.ProducerErrors
		if errors.As(err, &produceErrors) {
			for _, failure := range produceErrors {
				failures = append(failures, failure.Err)
				failed[failure.Msg] = true
			}
		} else if err != nil {
			return nil, err
		}
		for _, message := range messages {
			if !failed[message] {
				offsets = append(offsets, message.Offset)
			}
		}
	case "async":
		producer, err := sarama.NewAsyncProducer([]string{bootstrap}, conf)
		if err != nil {
			return nil, err
		}
		defer producer.Close()
		for _, message := range messages {
			producer.Input() <- message
		}
		timeout := time.After(deadline)
		for len(offsets)+len(failures) < count {
			select {
			case message := <-producer.Successes():
				offsets = append(offsets, message.Offset)
			case failure := <-producer.Errors():
				failures = append(failures, failure.Err)
			case <-timeout:
				return nil, fmt.Errorf("%d of %d records answered within %s", len(offsets)+len(failures), count, deadline)
			}
		}
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	answer := map[string]interface{}{"offsets": offsets}
	if len(failures) > 0 {
		answer["error"] = failures[0].Error()
		answer["failed"] = len(failures)
	}
	return answer, nil
}

// consume answers {"values": [...], "offsets": [...]} in the order read.
func consume(bootstrap, topic, version string, count int) (map[string]interface{}, error) {
	conf, err := config(version)
	if err != nil {
		return nil, err
	}
	conf.Consumer.Return.Errors = true
	consumer, err := sarama.NewConsumer([]string{bootstrap}, conf)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	partition, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		return nil, err
	}
	defer partition.Close()
	values, offsets := []string{}, []int64{}
	timeout := time.After(deadline)
	for len(values) < count {
		select {
		case message := <-partition.Messages():
			values = append(values, string(message.Value))
			offsets = append(offsets, message.Offset)
		case failure := <-partition.Errors():
			return map[string]interface{}{"error": failure.Err.Error(), "values": values}, nil
		case <-timeout:
			return map[string]interface{}{"error": "deadline", "values": values}, nil
		}
	}
	return map[string]interface{}{"values": values, "offsets": offsets}, nil
}
