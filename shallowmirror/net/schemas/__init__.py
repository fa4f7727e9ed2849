"""Apache Kafka's own JSON message schemas (copied from the Kafka 3.7 release, Apache License
2.0) for the APIs kafka-python 3.0 does not describe; ``net.group_api`` builds its classes from
them, as kafka-python builds its own."""
